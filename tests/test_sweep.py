"""Studies and the sweep driver: shipped studies plan, invalid studies are rejected before any run,
a killed driver resumes with only the missing runs, two drivers never run the same run, collect (all statuses)
and LR optima. The Slurm route is tested against a real Slurm in tests/test_slurm.py."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from depthbench_nb.config import ConfigError
from depthbench_nb.sweep import (
    RunLock,
    StudyGroup,
    StudySpec,
    collect,
    expand_study,
    _extend_lr_entries,
    load_study,
    lr_optima,
    plan_rows,
    _study_entries,
    study_names,
    study_status,
)

DRIVER = [sys.executable, "-c", "import sys; from depthbench_nb.cli import main; sys.exit(main())"]
PAPER_COUNTS = {
    "depthbench-400m": 210,
    "depthbench-main": 70,
    "backbone-300m": 60,
    "ladder": 90,
    "depthbench-1.6b": 30,
    "looped-main": 116,
    "looped-injection": 4,
    "looped-lr": 16,
}


def write_study(path: Path, name: str, data, lrs=(2e-3, 4e-3), depths=(2,), max_steps=2) -> Path:
    path.write_text(
        yaml.safe_dump(
            dict(
                name=name,
                preset="tiny",
                data=str(data),
                max_attempts=2,
                groups=[dict(name="g", archs=["preln"], depths=list(depths), lrs=list(lrs), max_steps=max_steps)],
            )
        )
    )
    return path


def executions(runs: Path, study: str) -> list[dict]:
    p = runs / study / ".sweep" / "executions.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def test_shipped_studies_expand_and_plan():
    names = study_names()
    assert {"demo", "looped-tbptt", "looped-hc"} | set(PAPER_COUNTS) <= set(names)
    for name, n in PAPER_COUNTS.items():
        assert len(expand_study(load_study(name))) == n, name
    grid = pd.DataFrame(plan_rows(expand_study(load_study("looped-main"))))
    # the looped grid spends its budgets: training FLOPs within a few % of C (tokens round to whole steps)
    assert ((grid.train_flops / grid.C - 1).abs() < 0.05).all()
    assert sorted(grid.groupby("r").size()) == [29, 29, 29, 29]
    demo = pd.DataFrame(plan_rows(expand_study(load_study("demo"))))
    looped = demo[demo.arch == "looped"]
    assert (
        len(looped) == 12
        and sorted(looped.r.unique()) == [1, 2, 4]
        and looped.C.nunique() == 2
        and looped.s.nunique() == 2
    )


def test_looped_lr_sweep_tokens_follow_the_reference_rule():
    "App. D / shells/ablations/sweep_lr.sh: 10 tokens per effective parameter (the loop counted r times), whole steps."
    from depthbench_nb.looped import looped_config, looped_params

    runs = expand_study(load_study("looped-lr"))
    assert len(runs) == 16
    for e in runs:
        m, t = e.run.model, e.run.train
        eff = looped_params(looped_config(10, m.recurrence)).effective(m.recurrence)  # independent: the closed form
        assert t.tokens == int(10 * eff) // 2**18 * 2**18 and t.global_batch * t.seq_len == 2**18
    steps = {e.run.model.recurrence: e.run.train.tokens // 2**18 for e in runs}
    assert steps == {1: 3751, 4: 3876}  # r = 4 trains 3.3% longer, as the reference does
    with pytest.raises(ConfigError, match="param_data_ratio"):
        StudyGroup(name="g", r=(1,), s=(10,), C=(1e18,), param_data_ratio=10.0)


def test_case_study_studies_reuse_looped_main():
    for name in ("looped-hc", "looped-tbptt"):
        spec = load_study(name)
        assert spec.reuses == "looped-main" and not any(e.run.model.recurrence == 1 for e in expand_study(spec))
    with pytest.raises(ConfigError, match="reuses"):
        StudySpec(name="x", groups=(StudyGroup(name="g", r=(1,), s=(10,), C=(1e18,)),), reuses="x")


@pytest.mark.parametrize(
    "group, message",
    [
        (dict(name="bad-design", archs=["preln", "resnet"], lrs=[2e-3]), "'resnet'"),
        (dict(name="bad-shape", archs=["preln"], depths=[17], lrs=[2e-3]), "bad-shape"),
        (dict(name="bad-lr", archs=["preln"], depths=[16], lrs=[-1e-3]), "learning rate"),
        (dict(name="bad-lr-type", archs=["preln"], depths=[16], lrs=["fast"]), "lrs"),
        (dict(name="bad-option", archs=["preln"], depths=[16], option_sets=[dict(hc_streams=4)]), "bad-option"),
    ],
)
def test_invalid_study_rejected_before_any_run(tmp_path, runs_dir, capsys, group, message):
    good = dict(name="ok", archs=["preln"], depths=[16, 20], lrs=[2e-3])
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(dict(name="bad", preset="400m", groups=[good, group])))
    with pytest.raises(ConfigError, match=message):
        expand_study(load_study(path))
    from depthbench_nb.cli import main

    assert main(["sweep", "run", str(path), "--executor", "python"]) == 2
    err = capsys.readouterr().err
    assert group["name"] in err or message.strip("'") in err
    assert not (runs_dir / "bad").exists() or not any(p.name != ".sweep" for p in (runs_dir / "bad").iterdir())


def read_metrics_rows(folder: Path) -> list:
    "The step rows a run has logged so far (a line being written is not one yet)."
    try:
        lines = (folder / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if "step" in row and row.get("kind") != "header":
            rows.append(row)
    return rows


def wait_for_group_to_die(pgid: int, timeout: float = 30.0) -> None:
    "Until no live (non-zombie) process of the group is left: SIGKILL is delivered, but dying takes a moment."

    def alive():
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
        return False

    deadline = time.time() + timeout
    while alive() and time.time() < deadline:
        time.sleep(0.05)


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory, tiny_data):
    "A 2-run study: the driver is killed after its first run completes, then rerun to the end."
    tmp = tmp_path_factory.mktemp("sweep-kill")
    runs = tmp / "runs"
    env = dict(os.environ, DEPTHBENCH_RUNS=str(runs), OMP_NUM_THREADS="1")
    study = write_study(
        tmp / "k.yaml", "killme", tiny_data, lrs=(2e-3, 4e-3), max_steps=12
    )  # run 2 is killed mid-training
    saved = os.environ.get("DEPTHBENCH_RUNS")
    os.environ["DEPTHBENCH_RUNS"] = str(runs)
    try:
        entries = expand_study(load_study(study))
    finally:
        os.environ["DEPTHBENCH_RUNS"] = saved  # the session's own runs folder, never unset
    first = runs / "killme" / entries[0].run_id / "result.json"
    drv = subprocess.Popen(
        DRIVER + ["sweep", "run", str(study), "--executor", "python", "--no-progress"],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    while not executions(runs, "killme") and time.time() < deadline and drv.poll() is None:
        time.sleep(0.2)
    assert first.exists() and drv.poll() is None, "the first run never completed"
    # run 2 is training once its metrics log has a step row; kill then, 11 steps before its result.json
    # (a fixed sleep lost this race on an idle machine: the tiny run finished inside it)
    second = runs / "killme" / entries[1].run_id
    while not read_metrics_rows(second) and time.time() < deadline and drv.poll() is None:
        time.sleep(0.02)
    os.killpg(drv.pid, signal.SIGKILL)  # the driver and its child, mid-way through run 2
    assert read_metrics_rows(second) and not (second / "result.json").exists(), "run 2 was not killed mid-way"
    drv.wait()
    wait_for_group_to_die(drv.pid)  # run 2's process holds its lock until it is gone
    stamp = first.stat().st_mtime_ns
    before = executions(runs, "killme")
    res = subprocess.run(
        DRIVER + ["sweep", "run", str(study), "--executor", "python", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:] + res.stdout[-1500:]
    return dict(
        runs=runs,
        study=study,
        entries=entries,
        first_stamp=stamp,
        first=first,
        before=before,
        after=executions(runs, "killme"),
        out=json.loads(res.stdout),
        env=env,
    )


def test_killed_driver_resumes_only_missing(killed_and_resumed):
    k = killed_and_resumed
    ids = [e.run_id for e in k["entries"]]
    assert [x["run_id"] for x in k["before"]] == [ids[0]]  # killed after exactly one run
    new = [x["run_id"] for x in k["after"][len(k["before"]) :]]
    assert new == [ids[1]]  # the rerun ran only the missing run
    assert k["first"].stat().st_mtime_ns == k["first_stamp"]  # the completed run was not touched
    actions = {o["run_id"]: o["action"] for o in k["out"]["outcomes"]}
    assert actions == {ids[0]: "skipped", ids[1]: "ran"}
    assert k["out"]["status"]["completed"] == 2


def test_collect_all_statuses_and_lr_optimum(killed_and_resumed, monkeypatch):
    k = killed_and_resumed
    monkeypatch.setenv("DEPTHBENCH_RUNS", str(k["runs"]))
    spec = load_study(k["study"])
    # a third run recorded as diverged and a fourth as failed (records written as the trainer would), added to the
    # study's plan as extra entries (as an LR extension is): a run outside the plan is stale and never collected
    from depthbench_nb.runs import run_dir, write_params
    from depthbench_nb.sweep import RunEntry, _add_extra_entries
    from depthbench_nb.run_params import make_run_config

    for lr, status in ((8e-3, "diverged"), (1.6e-2, "failed")):
        params = dict(
            arch="preln",
            L=2,
            preset="tiny",
            lr=lr,
            study="killme",
            data=str(k["entries"][0].run.data.path),
            max_steps=2,
        )
        run = make_run_config(**params, verbose=False)
        folder = run_dir(run)
        folder.mkdir(parents=True)
        write_params(folder, run)
        (folder / "result.json").write_text(
            json.dumps(dict(status=status, run_id=run.run_id, study="killme", arch="preln", lr=lr))
        )
        _add_extra_entries(spec, [RunEntry(0, "extra", params, run)])
    df = collect(spec)
    assert (k["runs"] / "killme" / "collect.parquet").exists() and (k["runs"] / "killme" / "collect.csv").exists()
    assert len(df) == 4 and sorted(df.status) == ["completed", "completed", "diverged", "failed"]
    assert {"model.arch", "train.lr", "data.source", "final_val_loss"} <= set(df.columns)
    back = pd.read_parquet(k["runs"] / "killme" / "collect.parquet")
    assert len(back) == 4 and set(back.run_id) == set(df.run_id)
    opt = lr_optima(df).iloc[0]
    completed = df[df.status == "completed"]
    assert (
        opt.best_lr == completed.loc[completed.final_val_loss.idxmin(), "lr"] and opt.n_lrs == 3 and opt.n_diverged == 1
    )
    # two completed LRs: the best is at an edge of the completed+diverged grid only if it is the smallest
    assert opt.edge == (opt.best_lr == 2e-3)
    status = study_status(spec)
    assert status["counts"]["completed"] == 2 and status["total"] == len(df) and status["stale"] == []


def test_two_drivers_never_run_the_same_run(tmp_path, tiny_data):
    runs = tmp_path / "runs"
    env = dict(os.environ, DEPTHBENCH_RUNS=str(runs), OMP_NUM_THREADS="1")
    study = write_study(tmp_path / "c.yaml", "twice", tiny_data, lrs=(1e-3, 2e-3, 4e-3), max_steps=2)
    cmd = DRIVER + ["sweep", "run", str(study), "--executor", "python", "--json"]
    drivers = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outs = [json.loads(d.communicate(timeout=600)[0]) for d in drivers]
    ran = [x["run_id"] for x in executions(runs, "twice")]
    assert len(ran) == 3 and len(set(ran)) == 3, executions(runs, "twice")  # each run executed exactly once
    by_driver = [{o["run_id"] for o in out["outcomes"] if o["action"] == "ran"} for out in outs]
    assert not (by_driver[0] & by_driver[1]) and len(by_driver[0] | by_driver[1]) == 3
    status = json.loads(
        subprocess.run(
            DRIVER + ["sweep", "status", str(study), "--json"], env=env, capture_output=True, text=True, timeout=120
        ).stdout
    )
    assert status["counts"]["completed"] == 3 and status["total"] == 3, status["counts"]


def test_run_lock_excludes_a_second_holder(runs_dir):
    with RunLock("s", "r1") as a:
        assert a.acquired
        with RunLock("s", "r1") as b:
            assert not b.acquired
    with RunLock("s", "r1") as c:
        assert c.acquired  # released on exit


def test_lr_optimum_parabola_and_extension(tmp_path, runs_dir, tiny_data):
    lrs = [5e-4, 1e-3, 2e-3, 4e-3]

    def loss(lr):
        return 3.0 + 0.04 * (np.log(lr) - np.log(1.3e-3)) ** 2

    df = pd.DataFrame(
        dict(
            arch="preln",
            L=2,
            d_model=272,
            r=None,
            s=None,
            C=None,
            status="completed",
            lr=lrs,
            final_val_loss=[loss(x) for x in lrs],
        )
    )
    o = lr_optima(df).iloc[0]
    assert np.isclose(o.parabola_lr, 1.3e-3) and np.isclose(o.parabola_loss, 3.0) and not o.edge
    assert np.isclose(o.basin_factor, np.exp(np.sqrt(0.01 / 0.04)))
    # best at the top of the grid: the driver proposes the next LR up, and keeps it in the study
    study = write_study(tmp_path / "e.yaml", "ext", tiny_data, lrs=(1e-3, 2e-3))
    spec = load_study(study)
    d = pd.DataFrame(
        dict(
            arch="preln",
            L=2,
            d_model=272,
            r=None,
            s=None,
            C=None,
            status="completed",
            lr=[1e-3, 2e-3],
            final_val_loss=[3.2, 3.1],
        )
    )
    new = _extend_lr_entries(spec, d)
    assert [e.params["lr"] for e in new] == [4e-3]
    assert len(_study_entries(spec)) == 3 and _extend_lr_entries(spec, d) == []
    # other extra runs (e.g. a report's) are remembered with their group and parameters
    from depthbench_nb.sweep import RunEntry, _add_extra_entries
    from depthbench_nb.run_params import make_run_config

    params = dict(new[0].params, arch="looped", r=2, s=1, C=5e11)
    params.pop("L")
    params.pop("lr")
    _add_extra_entries(spec, [RunEntry(0, "looped-extra", params, make_run_config(**params, verbose=False))])
    entries = _study_entries(spec)
    assert len(entries) == 4 and entries[-1].group == "looped-extra" and entries[-1].params["C"] == 5e11
    with pytest.raises(ConfigError, match="must belong to study"):
        _add_extra_entries(
            spec, [RunEntry(0, "x", params, make_run_config(**dict(params, study="other"), verbose=False))]
        )


def test_papermill_executor_and_looped_fit_table(tmp_path, monkeypatch, tiny_data):
    "Both kinds of run through the papermill template (nbs/10_train.ipynb), then the looped fit table."
    from depthbench_nb.looped import looped_params
    from depthbench_nb.runs import read_params, read_result
    from depthbench_nb.sweep import _looped_fit_table, run_study

    runs = tmp_path / "runs"
    monkeypatch.setenv("DEPTHBENCH_RUNS", str(runs))
    path = tmp_path / "pm.yaml"
    path.write_text(
        yaml.safe_dump(
            dict(
                name="pm",
                preset="tiny",
                data=str(tiny_data),
                groups=[
                    dict(name="designs", archs=["preln"], depths=[2], max_steps=2),
                    dict(name="loop", r=[2], s=[1], max_steps=2),
                ],
            )
        )
    )
    spec = load_study(path)
    out = run_study(spec, executor="papermill", progress=False)
    assert out["counts"] == {"ran": 2}
    for e in expand_study(spec):
        folder = runs / "pm" / e.run_id
        assert read_result(folder)["status"] == "completed" and (folder / "train.ipynb").exists()
        nb = json.loads((folder / "train.ipynb").read_text())
        assert nb["metadata"]["papermill"]["parameters"]["arch"] == e.params["arch"]
    df = collect(spec)
    fit = _looped_fit_table(df)
    assert len(fit) == 1 and fit.r.iloc[0] == 2 and fit.provenance.iloc[0] == "real"
    p = looped_params(read_params(runs / "pm" / fit.run_id.iloc[0]).model)
    assert (
        fit.n_once.iloc[0] == p.n_once
        and fit.n_rec.iloc[0] == p.n_rec
        and fit.D.iloc[0] == df[df.arch == "looped"].tokens.iloc[0]
    )
    assert (runs / "pm" / "fit_looped.csv").exists()


def test_failed_run_is_retried_up_to_the_limit(tmp_path):
    "A run that cannot start (its data is not prepared) fails, is retried max_attempts times, then left alone."
    runs = tmp_path / "runs"
    env = dict(
        os.environ,
        DEPTHBENCH_RUNS=str(runs),
        OMP_NUM_THREADS="1",
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        DEPTHBENCH_CACHE=str(tmp_path / "cache"),
    )
    path = tmp_path / "f.yaml"
    path.write_text(
        yaml.safe_dump(
            dict(
                name="failing",
                preset="400m",
                max_attempts=2,
                groups=[dict(name="a", archs=["preln"], depths=[16], max_steps=1)],
            )
        )
    )
    cmd = DRIVER + ["sweep", "run", str(path), "--executor", "python", "--json"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    out = json.loads(first.stdout)
    assert first.returncode == 1 and out["outcomes"][0]["action"] == "ran" and out["status"]["failed"] == 1
    assert [x["status"] for x in executions(runs, "failing")] == ["failed", "failed"]  # two attempts
    second = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300).stdout)
    assert second["outcomes"][0]["action"] == "gave up" and len(executions(runs, "failing")) == 2
    more = json.loads(
        subprocess.run(cmd + ["--max-attempts", "3"], env=env, capture_output=True, text=True, timeout=300).stdout
    )
    assert more["outcomes"][0]["action"] == "ran" and len(executions(runs, "failing")) == 3  # a higher limit retries


def test_worker_executor_writes_the_records_a_fresh_process_writes(tmp_path, tiny_data):
    """--executor worker: one process trains every run in turn; its runs' metrics equal those of a fresh process per run
    (the python executor) bit for bit, the runs held their locks and logged to their own files."""
    study = tmp_path / "w.yaml"
    study.write_text(
        yaml.safe_dump(
            dict(
                name="w",
                preset="tiny",
                data=str(tiny_data),
                max_attempts=1,
                groups=[dict(name="g", archs=["preln", "attnres", "hc"], depths=[2], lrs=[2e-3], max_steps=3)],
            )
        )
    )
    records = {}
    for executor in ("python", "worker"):
        runs = tmp_path / executor
        env = dict(os.environ, DEPTHBENCH_RUNS=str(runs), OMP_NUM_THREADS="1")
        out = subprocess.run(
            DRIVER + ["sweep", "run", str(study), "--executor", executor, "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        ran = executions(runs, "w")
        assert [x["executor"] for x in ran] == [executor] * 3 and all(
            x["status"] == "completed" and x["seconds"] > 0 for x in ran
        )
        records[executor] = {f.parent.name: read_metrics_rows(f.parent) for f in (runs / "w").glob("*/metrics.jsonl")}
        logs = list((runs / "w" / ".sweep" / "logs").glob("*.log"))
        assert len(logs) == 3 and all("step" in p.read_text() or "completed" in p.read_text() for p in logs)

    def keep(rows):
        return [{k: r.get(k) for k in ("step", "loss", "grad_norm", "val_loss", "lr")} for r in rows]

    assert set(records["python"]) == set(records["worker"]) and len(records["python"]) == 3
    for run_id, rows in records["python"].items():
        assert rows and keep(rows) == keep(records["worker"][run_id]), run_id
