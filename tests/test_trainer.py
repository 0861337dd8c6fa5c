"""The trainer: every design trains, exact resume, divergence, bad input before training, 2-rank DDP,
the CLI and the papermill template. Shapes are tiny (L2, d32, 4 x 32 tokens) so the file stays fast on 2 cores."""

import ast
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import papermill
import pytest
import torch

from depthbench_nb.config import ARCHS, DESIGN_OPTIONS, ConfigError, RunConfig
from depthbench_nb.runs import list_checkpoints, load_run, read_metrics, read_result, run_dir
from depthbench_nb.shapes import count_params, shape_for
from depthbench_nb.callbacks import Callback, DivergenceGuard
from depthbench_nb.optim import _build_adamw, _lr_multiplier
from depthbench_nb.trainer import init_model, train
from depthbench_nb.run_params import make_run_config

REPO = Path(__file__).resolve().parents[1]
DESIGNS = list(ARCHS)  # the ten residual designs and the looped model


def tiny_run(arch="preln", data=None, steps=3, study="t", **kw) -> RunConfig:
    "A CPU-sized run: L2 d32 (looped: the tiny looped model, d128), 4 sequences of 32 tokens per step."
    train_kw = dict(seq_len=32, global_batch=4, eval_batches=1)
    train_kw.update({k: kw.pop(k) for k in list(kw) if k in ("seq_len", "global_batch", "eval_batches", "warmup_frac")})
    shape = {} if arch == "looped" else dict(L=kw.pop("L", 2), d_model=kw.pop("d_model", 32))
    kw.setdefault("eval_every", 2)
    run = make_run_config(
        arch, preset="tiny", max_steps=steps, study=study, data=str(data), verbose=False, **shape, **kw
    )
    return run.replace(train=run.train.replace(**train_kw))


# ---------------------------------------------------------------------------------------------------- config
def test_auto_preset_is_tiny_on_cpu_and_said(capsys):
    run = make_run_config("attnres", L=32)  # the acceptance command's config
    assert not torch.cuda.is_available() and run.preset == "tiny"
    assert "PRESET: tiny" in capsys.readouterr().out
    assert (run.model.n_layer, run.model.d_model) == (32, shape_for("tiny", 32).d_model)
    assert (
        run.train.init_seed == 0
    )  # the official fixed init seed (keyu-wang-2002/DepthBench examples/pretrain_llama_base.py)


@pytest.mark.parametrize(
    "kw, rule",
    [
        (dict(arch="resnet", L=4), "unknown architecture"),
        (dict(arch="preln", L=17, preset="400m"), "not in grid"),
        (dict(arch="preln", L="32"), "L must be an integer"),
        (dict(arch="preln", L=8, lr="fast"), "lr must be a number"),
        (dict(arch="preln", L=8, seed=1.5), "seed must be an integer"),
        (dict(arch="preln", L=8, hc_streams=4), "does not apply"),
        (dict(arch="preln", L=8, preset="huge"), "unknown preset"),
        (dict(arch="preln"), "set L"),
        (dict(arch="preln", L=True), r"L must be an integer, got True \(bool\)"),
        (dict(arch="preln", L=8, compile="yes"), "compile must be True, False or None"),
        (dict(arch=3, L=8), "arch must be a design name"),
        (dict(arch="preln", L=8, init_seed=1.5), "init_seed must be 'official', 'tied' or an integer"),
    ],
)
def test_bad_config_is_refused(kw, rule):
    with pytest.raises(ConfigError, match=rule):
        make_run_config(verbose=False, **kw)


def test_off_grid_depth_with_d_model():
    run = make_run_config("preln", L=17, d_model=1024, preset="400m", verbose=False)
    assert run.model.ffn_hidden == math.ceil(8 * 1024 / 3 / 16) * 16 and run.model.n_head == 16


def test_schedule_matches_olmo_core_closed_form():
    total, w = 7600, 760
    for s in (0, 100, 759, 760, 2000, 5000, 7599):
        want = s / w if s < w else 0.1 + 0.9 * (1 + math.cos(math.pi * (s - w) / (total - w))) / 2
        assert _lr_multiplier(s, total) == pytest.approx(want, abs=1e-15)
    assert _lr_multiplier(0, 10, "linear", 0.0) == 1.0 and _lr_multiplier(10, 10, "linear", 0.0) == pytest.approx(0.1)


def test_weight_decay_exempts_only_static_routing():
    for arch in ("preln", "hc", "mhc"):
        model = init_model(tiny_run(arch, data="sample"))
        opt = _build_adamw(model, tiny_run(arch, data="sample").train)
        exempt = model.no_weight_decay_names()
        groups = {g["group"]: g for g in opt.param_groups}
        assert groups["decay"]["weight_decay"] == 0.1
        n_exempt = sum(p.numel() for n, p in model.named_parameters() if n in exempt)
        assert sum(p.numel() for p in groups.get("no_decay", {"params": []})["params"]) == n_exempt
        assert (n_exempt > 0) == (arch != "preln")


def test_init_seed_official_is_fixed_and_tied_follows_seed():
    a, b = (init_model(tiny_run("preln", data="sample", seed=s)) for s in (1, 2))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    c, d = (init_model(tiny_run("preln", data="sample", seed=s, init_seed="tied")) for s in (1, 2))
    assert not torch.equal(next(c.parameters()), next(d.parameters()))


# ---------------------------------------------------------------------------------------------------- bad input
def test_missing_data_stops_with_the_prepare_command(runs_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHBENCH_CACHE", str(tmp_path / "empty-cache"))
    run = make_run_config("preln", L=16, preset="400m", verbose=False)  # paper preset: FineWeb-Edu, not prepared
    with pytest.raises(ConfigError, match="depthbench-nb data prepare --source fineweb-edu"):
        train(run, progress=False)
    assert not (run_dir(run) / "metrics.jsonl").exists() and read_result(run_dir(run)) is None


def test_unwritable_output_folder_fails_before_training(tmp_path, monkeypatch, tiny_data):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("DEPTHBENCH_RUNS", str(blocker / "runs"))
    with pytest.raises(ConfigError, match="not writable"):
        train(tiny_run(data=tiny_data), progress=False)


def test_unknown_or_missing_tracker_is_refused(runs_dir, tiny_data):
    with pytest.raises(ConfigError, match="unknown tracker"):
        train(tiny_run(data=tiny_data, trackers=["mlflow-x"]), progress=False)


def test_train_refuses_a_non_config():
    with pytest.raises(ConfigError, match="RunConfig"):
        train({"arch": "preln"})


# ---------------------------------------------------------------------------------------------------- training
@pytest.mark.parametrize("arch", DESIGNS)
def test_every_design_trains(arch, runs_dir, tiny_data):
    run = tiny_run(
        arch, data=tiny_data, steps=2, **(dict(L=4) if arch == "block_attnres" else {})
    )  # 8 blocks need 2L >= 8 sublayers
    res = train(run, progress=False)
    assert res["status"] == "completed" and res["steps"] == 2 and res["tokens"] == 2 * 4 * 32
    assert res["params_total"] == count_params(run.model).total  # instantiated == closed form
    rows = read_metrics(run_dir(run))
    assert [r["step"] for r in rows] == [0, 1] and all(math.isfinite(r["loss"]) for r in rows)
    assert abs(rows[0]["loss"] - math.log(4096)) < 0.6  # near-uniform prediction at init
    assert rows[-1]["val_loss"] == pytest.approx(res["final_val_loss"])
    assert res["train_flops"] > 0 and set(res["provenance"]) >= {"git_commit", "torch", "device", "time"}
    assert (run_dir(run) / "loss_curve.png").stat().st_size > 1000
    assert [s for s, _ in list_checkpoints(run_dir(run))] == [2]
    if (
        arch == "looped"
    ):  # the looped recipe (arXiv 2604.21106 §4.1, App. D): MuonH, no warmup, linear decay, no clipping
        assert (run.train.optimizer, run.train.grad_clip, run.train.warmup_frac) == ("muonh", None, 0.0)
        assert rows[1]["lr"] / rows[0]["lr"] == pytest.approx(1 - 0.9 * 1 / 2)


def test_completed_run_is_not_retrained_and_load_run_reproduces_val_loss(runs_dir, tiny_data):
    run = tiny_run("preln", data=tiny_data, steps=2)
    res = train(run, progress=False)
    assert train(run, progress=False)["provenance"]["time"] == res["provenance"]["time"]  # the stored record
    model, loaded = load_run(run_dir(run))
    assert loaded == run
    from depthbench_nb.data import TokenData, resolve_data

    ((x, y),) = TokenData(resolve_data(run.data)).val_batches(1, 4, 32, seed=0)
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    assert loss == pytest.approx(res["final_val_loss"], rel=1e-6)
    (run_dir(run) / "result.json").unlink()  # the result lost after the final checkpoint landed
    again = train(run, progress=False)  # resumes at the end: nothing to train, same figures
    assert (again["status"], again["steps"], again["final_val_loss"]) == ("completed", 2, res["final_val_loss"])


def test_resume_reproduces_the_uninterrupted_curve_exactly(tmp_path, monkeypatch, tiny_data):
    run = tiny_run("preln", data=tiny_data, steps=6, checkpoint_every=2)
    monkeypatch.setenv("DEPTHBENCH_RUNS", str(tmp_path / "a"))
    full = train(run, progress=False)
    want = read_metrics(run_dir(run))
    monkeypatch.setenv("DEPTHBENCH_RUNS", str(tmp_path / "b"))
    assert train(run, progress=False, stop_after=5)["status"] == "stopped"
    folder = run_dir(run)
    assert [s for s, _ in list_checkpoints(folder)] == [4, 5] and read_result(folder) is None
    shutil.rmtree(dict(list_checkpoints(folder))[5])  # a crash after step 5, before its checkpoint landed
    got_res = train(run, progress=False)
    got = read_metrics(folder)
    assert [r["step"] for r in got] == list(range(6))  # rows after the checkpoint were replaced, not duplicated
    for key in ("loss", "grad_norm", "lr"):
        assert [r[key] for r in got] == [r[key] for r in want], key
    assert got_res["final_val_loss"] == full["final_val_loss"]
    # result.json summarises the costs of every step row, the rows written before the resume included
    tps = [r["tokens_per_s"] for r in got]
    mem = [r["peak_mem_bytes"] for r in got if r.get("peak_mem_bytes") is not None]
    assert got_res["tokens_per_s_median"] == pytest.approx(statistics.median(tps)) and len(tps) == 6
    assert got_res["peak_mem_bytes"] == (max(mem) if mem else None)
    assert read_result(folder)["tokens_per_s_median"] == got_res["tokens_per_s_median"]
    from depthbench_nb.runs import _read_metrics_headers

    assert [h.get("resumed_at_step") for h in _read_metrics_headers(folder)] == [
        None,
        4,
    ]  # the first run's, the resume's


def test_checkpoint_of_another_config_is_refused(runs_dir, tiny_data):
    a = tiny_run("preln", data=tiny_data, steps=2)
    train(a, progress=False)
    b = tiny_run("preln", data=tiny_data, steps=2, lr=1e-3)
    ckpt = list_checkpoints(run_dir(a))[-1][1]
    shutil.copytree(ckpt, run_dir(b) / "checkpoints" / ckpt.name)
    with pytest.raises(ConfigError, match=r"different config.*train\.lr: 0\.002 -> 0\.001"):
        train(b, progress=False)


def test_absurd_lr_diverges_without_crashing(runs_dir, tiny_data):
    run = tiny_run("preln", data=tiny_data, steps=8, lr=1e6, warmup_frac=0.0)
    res = train(run, progress=False)  # returns: a sweep goes on
    assert res["status"] == "diverged" and 0 <= res["diverged_step"] < 8
    assert read_result(run_dir(run))["diverged_step"] == res["diverged_step"]
    last = read_metrics(run_dir(run))[-1]
    # the step that diverged is recorded with the value that gave it away: a train loss, a gradient norm or a
    # validation loss that is not finite (which one comes first depends on the platform's arithmetic)
    watched = [last[k] for k in ("loss", "grad_norm", "val_loss") if k in last]
    assert last["step"] == res["diverged_step"] and not all(math.isfinite(v) for v in watched)


def test_a_crash_leaves_a_failed_record_and_reraises(runs_dir, tiny_data, monkeypatch):
    from depthbench_nb.data import TokenData

    real = TokenData.train_batch

    def flaky(self, step, *a, **k):
        if step == 1:
            raise RuntimeError("disk vanished")
        return real(self, step, *a, **k)

    monkeypatch.setattr(TokenData, "train_batch", flaky)
    run = tiny_run("preln", data=tiny_data, steps=3)
    with pytest.raises(RuntimeError, match="disk vanished"):
        train(run, progress=False)
    res = read_result(run_dir(run))
    assert res["status"] == "failed" and "disk vanished" in res["error"] and res["steps"] == 1
    monkeypatch.setattr(TokenData, "train_batch", real)
    assert train(run, progress=False)["status"] == "completed"  # a failed run is retried (from scratch: no checkpoint)


def test_precisions_and_layer_stats(runs_dir, tiny_data):
    pure = tiny_run("preln", data=tiny_data, steps=2, precision="bf16-pure", layer_stats_every=1)
    assert train(pure, progress=False)["status"] == "completed"
    model, _ = load_run(run_dir(pure))
    assert next(model.parameters()).dtype == torch.float32  # load_run builds fp32; bf16 weights load into it
    stats = [json.loads(line) for line in (run_dir(pure) / "layer_stats.jsonl").read_text().splitlines()]
    assert [s["step"] for s in stats] == [0, 1]
    assert sorted(stats[0]["layers"]) == ["block_00", "block_01"]
    for kind in ("forward", "backward"):
        st = stats[0]["layers"]["block_01"][kind]
        assert st["variance"] >= 0 and st["magnitude"] > 0 and st["norm"] > 0
    mixed = tiny_run("preln", data=tiny_data, steps=2, precision="bf16-mixed")
    assert train(mixed, progress=False)["status"] == "completed"


def test_two_gloo_ranks_match_one_process(runs_dir, tiny_data):
    single = tiny_run("preln", data=tiny_data, steps=3, study="single")
    ddp = single.replace(num_processes=2, study="ddp")
    one = train(single, progress=False)
    two = train(ddp, progress=False)  # accelerate launch --multi_gpu --num_processes 2 (gloo)
    assert two["status"] == "completed" and two["world_size"] == 2 and two["ranks_in_sync"] is True
    a, b = read_metrics(run_dir(single)), read_metrics(run_dir(ddp))
    for ra, rb in zip(a, b):
        assert abs(ra["loss"] - rb["loss"]) <= 1e-5 * abs(ra["loss"])
    assert abs(one["final_val_loss"] - two["final_val_loss"]) <= 1e-5 * one["final_val_loss"]


# ---------------------------------------------------------------------------------------------------- entry points
def test_cli_train(runs_dir, tiny_data, capsys):
    from depthbench_nb.cli import main

    rc = main(
        [
            "train",
            "--arch",
            "periln",
            "--L",
            "2",
            "--d-model",
            "32",
            "--preset",
            "tiny",
            "--max-steps",
            "1",
            "--data",
            str(tiny_data),
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["status"] == "completed" and out["arch"] == "periln" and out["steps"] == 1
    assert main(["train", "--arch", "nope", "--L", "2"]) == 2
    assert "unknown architecture" in capsys.readouterr().err


def test_train_template_has_one_literal_parameters_cell():
    nb = json.loads((REPO / "nbs" / "10_train.ipynb").read_text())
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    params = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1
    tree = ast.parse("".join(params[0]["source"]))
    for stmt in tree.body:
        assert isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
        assert isinstance(stmt.value, ast.Constant), ast.dump(stmt)
    names = {s.targets[0].id for s in tree.body}
    assert {
        "arch",
        "L",
        "ratio",
        "d_model",
        "preset",
        "lr",
        "seed",
        "study",
        "data",
        "num_processes",
        "tokens",
        "max_steps",
        "r",
        "s",
        "C",
        "precision",
        "init_seed",
        "micro_batch",
        "trackers",
    } | set(DESIGN_OPTIONS) - {"recurrence"} <= names


def test_papermill_template_end_to_end(runs_dir, tiny_data, tmp_path):
    out = tmp_path / "out.ipynb"
    cmd = [
        sys.executable,
        "-m",
        "papermill",
        str(REPO / "nbs" / "10_train.ipynb"),
        str(out),
        "-p",
        "arch",
        "keel",
        "-p",
        "L",
        "2",
        "-p",
        "d_model",
        "32",
        "-p",
        "max_steps",
        "2",
        "-p",
        "data",
        str(tiny_data),
        "-p",
        "study",
        "pm",
        "--cwd",
        str(tmp_path),
    ]  # another working directory: the record still goes to runs_root()
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    runs = list((runs_dir / "pm").glob("keel-L2-d32-*"))
    assert len(runs) == 1 and read_result(runs[0])["status"] == "completed"
    text = json.dumps(json.loads(out.read_text())["cells"])
    assert "PRESET: tiny" in text and "image/png" in text and "final_val_loss" in text
    copied = runs[0] / "train.ipynb"  # the executed notebook joins the record once papermill exits
    for _ in range(30):
        if copied.exists():
            break
        time.sleep(0.5)
    assert copied.read_text() == out.read_text()


# ------------------------------------------------------------------------------ one definition of a run's parameters
def test_the_parameters_cell_is_generated_from_run_params():
    from depthbench_nb.run_params import RunParams

    nb = json.loads((REPO / "nbs" / "10_train.ipynb").read_text())
    (cell,) = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert "".join(cell["source"]) == RunParams.parameters_cell(arch="attnres", L=32), (
        "regenerate the cell: print(RunParams.parameters_cell(arch='attnres', L=32))"
    )
    # papermill reads every parameter with its help from the cell (`papermill --help-notebook`)
    inferred = papermill.inspect_notebook(str(REPO / "nbs" / "10_train.ipynb"))
    assert list(inferred) == [line.split(" = ")[0] for line in "".join(cell["source"]).splitlines()]
    assert all(p["help"] for p in inferred.values()), [name for name, p in inferred.items() if not p["help"]]


def test_train_options_are_the_run_params():
    from dataclasses import fields
    from depthbench_nb.run_params import RunParams
    from depthbench_nb.trainer import train_parser

    p = train_parser()
    dests = {a.dest: a for a in p._actions}
    for f in fields(RunParams):
        if f.name == "options":
            continue
        assert f.name in dests, f.name
        assert dests[f.name].default == f.default, (f.name, dests[f.name].default, f.default)
    assert set(DESIGN_OPTIONS) - {"recurrence"} <= set(dests)
    a = p.parse_args(
        [
            "--arch",
            "hc",
            "-L",
            "4",
            "--init-seed",
            "7",
            "--hc-streams",
            "2",
            "--no-compile",
            "--trackers",
            "tensorboard",
        ]
    )
    assert (a.arch, a.L, a.init_seed, a.hc_streams, a.compile, a.trackers) == ("hc", 4, 7, 2, False, "tensorboard")


def test_make_run_config_takes_run_params_by_position_and_name():
    from depthbench_nb.run_params import RunParams

    a = make_run_config("hc", 4, 32, "tiny", verbose=False, hc_streams=2)
    b = RunParams(arch="hc", L=4, d_model=32, preset="tiny", options=dict(hc_streams=2)).resolve(verbose=False)
    assert a == b and a.model.hc_streams == 2
    with pytest.raises(ConfigError, match="given twice"):
        make_run_config("hc", arch="preln")
    with pytest.raises(ConfigError, match="arch is required"):
        make_run_config(L=4, verbose=False)


# ------------------------------------------------------------------------------------------ callbacks and provenance
def test_a_user_callback_adds_a_column_and_sees_every_hook(runs_dir, tiny_data):
    from depthbench_nb.runs import _read_metrics_headers

    seen = []

    class GradNormSquared(Callback):
        order = 25  # after the evaluator, before the metrics writer

        def on_train_start(self, state):
            seen.append("start")

        def on_step_end(self, state):
            state.row["grad_norm_sq"] = state.row["grad_norm"] ** 2
            seen.append(state.step)

        def on_train_end(self, state):
            seen.append(state.status)

    run = tiny_run(data=tiny_data, steps=3)
    res = train(run, progress=False, callbacks=[GradNormSquared()])
    rows = read_metrics(run_dir(run))
    assert res["status"] == "completed" and seen == ["start", 0, 1, 2, "completed"]
    assert all(r["grad_norm_sq"] == pytest.approx(r["grad_norm"] ** 2) for r in rows)
    (header,) = _read_metrics_headers(run_dir(run))  # the first line names what produced the rows
    assert header["run_id"] == run.run_id and header["config"] == run.to_dict() and "git_dirty" in header["provenance"]
    params = json.loads((run_dir(run) / "params.json").read_text())
    assert {"git_commit", "git_dirty", "git_diff_sha256", "torch", "device"} <= set(params["provenance"])


def test_params_json_is_written_before_step_0(runs_dir, tiny_data):
    class Peek(Callback):
        def on_train_start(self, state):
            self.params = json.loads((state.folder / "params.json").read_text())
            self.lines = (state.folder / "metrics.jsonl").read_text().splitlines()

    peek = Peek()
    run = tiny_run(data=tiny_data, steps=1)
    train(run, progress=False, callbacks=[peek])
    assert peek.params["run_id"] == run.run_id and "provenance" in peek.params
    assert len(peek.lines) == 1 and json.loads(peek.lines[0])["kind"] == "header"


# ------------------------------------------------------------------------------------- callbacks across a resume
class LossLedger(Callback):
    "A user's stateful callback: the steps it saw and the sum of their losses."

    order = 35

    def __init__(self):
        self.steps, self.loss_sum = 0, 0.0

    def state_dict(self):
        return dict(steps=self.steps, loss_sum=self.loss_sum)

    def load_state_dict(self, state):
        self.steps, self.loss_sum = state["steps"], state["loss_sum"]

    def on_step_end(self, state):
        self.steps += 1
        self.loss_sum += state.row["loss"]


class GuardProbe(Callback):
    "The divergence guard's state at the start of each segment and after every step."

    order = 90

    def __init__(self):
        self.at_start, self.after, self.guard = [], {}, None

    def on_train_start(self, state):
        self.guard = next(cb for cb in state.callbacks if isinstance(cb, DivergenceGuard))
        self.at_start.append(self.guard.state_dict())

    def on_step_end(self, state):
        self.after[state.step] = self.guard.state_dict()


def test_callbacks_continue_where_they_stopped_on_resume(tmp_path, monkeypatch, tiny_data):
    run = tiny_run("preln", data=tiny_data, steps=6, checkpoint_every=2)
    monkeypatch.setenv("DEPTHBENCH_RUNS", str(tmp_path / "a"))
    ledger_full, probe_full = LossLedger(), GuardProbe()
    train(run, progress=False, callbacks=[ledger_full, probe_full])
    monkeypatch.setenv("DEPTHBENCH_RUNS", str(tmp_path / "b"))
    first = LossLedger()
    assert train(run, progress=False, stop_after=4, callbacks=[first])["status"] == "stopped"
    meta = json.loads((dict(list_checkpoints(run_dir(run)))[4] / "meta.json").read_text())
    assert meta["callbacks"]["LossLedger"] == dict(steps=4, loss_sum=first.loss_sum)
    ledger, probe = LossLedger(), GuardProbe()  # new objects: their state comes from the checkpoint
    assert train(run, progress=False, callbacks=[ledger, probe])["status"] == "completed"
    assert probe.at_start == [probe_full.after[3]] and probe.at_start[0]  # the best loss of steps 0-3, not fresh
    assert ledger.state_dict() == ledger_full.state_dict()  # 6 steps, the same sum to the last bit
    assert probe.after[5] == probe_full.after[5]


def test_a_checkpoint_without_callback_state_resumes_with_fresh_callbacks(runs_dir, tiny_data):
    from depthbench_nb.runs import write_checksums

    run = tiny_run("preln", data=tiny_data, steps=4, checkpoint_every=2)
    assert train(run, progress=False, stop_after=2, callbacks=[LossLedger()])["status"] == "stopped"
    ckpt = dict(list_checkpoints(run_dir(run)))[2]
    meta = json.loads((ckpt / "meta.json").read_text())
    del meta["callbacks"]  # as checkpoints were written before callbacks had state
    (ckpt / "meta.json").write_text(json.dumps(meta))
    write_checksums(ckpt, ["model.safetensors", "meta.json", "train_state.pt"])
    ledger, probe = LossLedger(), GuardProbe()
    assert train(run, progress=False, callbacks=[ledger, probe])["status"] == "completed"
    rows = read_metrics(run_dir(run))
    assert probe.at_start == [{}]  # the guard starts fresh
    assert ledger.state_dict() == dict(steps=2, loss_sum=rows[2]["loss"] + rows[3]["loss"])  # steps 2 and 3 only
