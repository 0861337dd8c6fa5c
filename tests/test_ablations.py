"""Ablations without editing code: any config field by its dotted name from the CLI (`--set`), papermill (`overrides`)
and a study (`set:`); callbacks by import path on every process; the shipped `warmup-ablation` study. Runs are tiny
(L2-L8, 4 x 32 tokens, 2 steps) so the file stays fast on 2 cores."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pandas as pd
import pytest
import yaml

from depthbench_nb import report_depthbench, run_params
from depthbench_nb.cli import main
from depthbench_nb.config import DataConfig, ModelConfig, TrainConfig, identity_rule_breaches
from depthbench_nb.run_params import RunParams, make_run_config, parse_overrides, settable_fields
from depthbench_nb.report_common import PaperPlan, run_comparability
from depthbench_nb.runs import run_dir, write_params
from depthbench_nb.sweep import StudyGroup, collect, _collect_by, expand_study, load_study
from depthbench_nb.trainer import train

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
SMALL = {"train.seq_len": 32, "train.global_batch": 4, "train.eval_batches": 1, "train.eval_every": 2}
PROBE = "ablation_probe:StepProbe"  # tests/ablation_probe.py


def _small_cli(*extra) -> list[str]:
    return [a for k, v in SMALL.items() for a in ("--set", f"{k}={v}")] + list(extra)


@pytest.fixture
def probe_importable(monkeypatch):
    "Child processes (papermill's kernel, accelerate's ranks) import the probe callback from tests/."
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))


# ----------------------------------------------------------------------------------------------- 1-2. dotted names
def test_every_config_field_has_one_dotted_name():
    table = settable_fields()
    expected = ({f"model.{f.name}" for f in dataclasses.fields(ModelConfig)} - {"model.arch", "model.options"}) | {
        f"{s}.{f.name}" for s, cls in (("data", DataConfig), ("train", TrainConfig)) for f in dataclasses.fields(cls)
    }
    backbone = {n for n, (_, kind) in table.items() if not kind.startswith("a design option")}
    assert backbone == expected  # the generated set equals the dataclasses' fields, no more, no fewer
    assert {"model.hc_streams", "model.attnres_block_size", "model.recurrence"} <= set(table)  # design options
    assert identity_rule_breaches() == []  # the rule that keeps old run ids holds for every field


def test_a_field_added_to_train_config_is_settable_everywhere_with_no_other_edit(monkeypatch, tmp_path, capsys):
    @dataclasses.dataclass(frozen=True)
    class WithSmoothing(TrainConfig):
        label_smoothing: Optional[float] = None
        _OMIT_WHEN_NONE = TrainConfig._OMIT_WHEN_NONE | {"label_smoothing"}

    monkeypatch.setattr(run_params, "TrainConfig", WithSmoothing)  # the one edit: the field itself
    assert identity_rule_breaches(dict(train=WithSmoothing)) == []
    base = make_run_config("preln", L=2, preset="tiny", verbose=False)
    # the Python / papermill form (RunParams.overrides: the notebook's `overrides` parameter)
    ran = RunParams.from_namespace(dict(arch="preln", L=2, preset="tiny", overrides={"train.label_smoothing": 0.1}))
    run = ran.resolve(verbose=False)
    assert run.train.label_smoothing == 0.1 and run.overrides == {"train.label_smoothing": 0.1}
    assert run.run_id != base.run_id
    unset = make_run_config("preln", L=2, preset="tiny", verbose=False, overrides={"train.label_smoothing": None})
    assert unset.run_id == base.run_id  # the default: the id of before
    # the CLI form: --set parses into the same overrides
    assert parse_overrides(["train.label_smoothing=0.1"]) == {"train.label_smoothing": 0.1}
    assert "label_smoothing (float or None)" in " ".join(_train_help().split())  # listed by --help
    # the study form: a group's set: sweeps it
    spec = tmp_path / "s.yaml"
    group = dict(name="g", archs=["preln"], depths=[2], set={"train.label_smoothing": [0.0, 0.1]})
    spec.write_text(yaml.safe_dump(dict(name="s", preset="tiny", groups=[group])))
    entries = expand_study(load_study(spec))
    assert [e.run.train.label_smoothing for e in entries] == [0.0, 0.1]
    assert len({e.run_id for e in entries}) == 2


def _train_help() -> str:
    from depthbench_nb.trainer import train_parser

    return train_parser().format_help()


# ------------------------------------------------------------------------------ item 1: the three forms, the errors
def test_set_on_the_command_line_records_the_values_and_keeps_the_ids(runs_dir, tiny_data, capsys):
    argv = ["train", "--arch", "preln", "--L", "2", "--d-model", "32", "--preset", "tiny", "--max-steps", "2"]
    argv += ["--data", str(tiny_data), "--study", "cli", "--json"]
    rc = main(argv + _small_cli("--set", "train.warmup_frac=0.01", "--set", "train.betas=[0.9,0.99]"))
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["status"] == "completed", out
    (folder,) = (runs_dir / "cli").glob("preln-*")
    params = json.loads((folder / "params.json").read_text())
    assert params["train"]["warmup_frac"] == 0.01 and params["train"]["betas"] == [0.9, 0.99]
    assert params["overrides"]["train.warmup_frac"] == 0.01 and params["overrides"]["train.betas"] == [0.9, 0.99]
    assert set(params["overrides"]) == {"train.warmup_frac", "train.betas", *SMALL}  # what differs from the preset
    assert sorted(params["train"]) == sorted(f.name for f in dataclasses.fields(TrainConfig))  # every field

    def run_id(**overrides):
        kw = dict(preset="tiny", max_steps=2, data=str(tiny_data), verbose=False)
        return make_run_config("preln", L=2, d_model=32, overrides=dict(SMALL, **overrides), **kw).run_id

    assert folder.name == run_id(**{"train.warmup_frac": 0.01, "train.betas": [0.9, 0.99]})
    assert run_id(**{"train.warmup_frac": 0.1}) == run_id()  # the preset's own value: the id of no override
    assert run_id(**{"train.warmup_frac": 0.05}) != run_id()
    assert run_id(**{"train.keep_checkpoints": 7, "train.checkpoint_every": 1}) == run_id()  # operational

    for extra, words in [
        (["--set", "train.warmup_fraction=0.01"], ["unknown config name", "closest: train.warmup_frac"]),
        (["--set", "train.warmup_frac=often"], ["train.warmup_frac must be float", "'often' (str)"]),
        (["--set", "train.warmup_frac=1.5"], ["train.warmup_frac=1.5 (float) refused", "must be in [0, 1)"]),
        (["--set", "train.warmup_frac"], ["--set takes NAME=VALUE"]),
        (["--callback", "ablation_probe.StepProbe"], ["must be 'package.module:Name'"]),
    ]:
        assert main(argv[:-1] + extra) == 2, extra
        err = capsys.readouterr().err
        assert all(w in err for w in words), err
    assert len(list((runs_dir / "cli").iterdir())) == 1  # nothing was built for the refused ones


def test_an_override_the_paper_grid_fixes_marks_the_run_off_grid(tmp_path, capsys):
    on = make_run_config("preln", L=16, preset="400m", overrides={"train.lr": 1e-3, "train.micro_batch": 8})
    off = make_run_config("preln", L=16, preset="400m", overrides={"train.seq_len": 1024, "model.n_kv_head": 4})
    said = capsys.readouterr().out
    assert on.off_grid == () and off.off_grid == ("model.n_kv_head", "train.seq_len")
    assert "OFF GRID" in said and "leave(s) the 400m grid" in said and "not comparable with the paper" in said
    tiny = make_run_config("preln", L=4, preset="tiny", verbose=False, overrides={"train.seq_len": 64})
    assert tiny.off_grid == ()  # the tiny preset is no paper grid
    params = json.loads(write_params(tmp_path / "r", off, say=lambda m: None).read_text())
    assert params["off_grid"] == ["model.n_kv_head", "train.seq_len"] and params["model"]["n_kv_head"] == 4
    # the reports: a run off the grid is not comparable with the paper's cell, whatever else matches
    plan = PaperPlan(label="400M L16", shape=dict(d_model=off.model.d_model))
    record = dict(status="completed", d_model=off.model.d_model)
    assert run_comparability(record, plan) == (True, [])
    ok, why = run_comparability(dict(record, off_grid=params["off_grid"], overrides=params["overrides"]), plan)
    assert not ok and why == ["left the paper grid (set: model.n_kv_head=4, train.seq_len=1,024)"]


def test_papermill_overrides_and_callbacks(runs_dir, tiny_data, tmp_path, probe_importable):
    values = dict(
        arch="preln",
        L=2,
        d_model=32,
        preset="tiny",
        max_steps=2,
        data=str(tiny_data),
        study="pm",
        overrides=dict(SMALL, **{"train.warmup_frac": 0.01}),
        callbacks=[{"path": PROBE, "args": {"tag": "pm"}}],
    )
    cmd = [sys.executable, "-m", "papermill", str(REPO / "nbs" / "10_train.ipynb"), str(tmp_path / "out.ipynb")]
    subprocess.run(cmd + ["-y", yaml.safe_dump(values)], check=True, capture_output=True, text=True, timeout=600)
    (folder,) = (runs_dir / "pm").glob("preln-*")
    params = json.loads((folder / "params.json").read_text())
    assert params["train"]["warmup_frac"] == 0.01 and params["overrides"]["train.warmup_frac"] == 0.01
    assert params["callbacks"] == [{"path": PROBE, "args": {"tag": "pm"}}]
    assert json.loads((folder / "pm-rank0.json").read_text())["n"] == 2  # built from the record, it saw both steps


# ------------------------------------------------------------------------------------------------ item 6: callbacks
def test_a_callback_by_import_path_is_checkpointed_and_resumed(runs_dir, tiny_data):
    run = make_run_config(
        "preln", L=2, d_model=32, preset="tiny", max_steps=4, data=str(tiny_data), study="cb", verbose=False,
        overrides=SMALL, callbacks=[f'{PROBE}={{"tag": "cb"}}'],
    )  # fmt: skip
    assert train(run, progress=False, stop_after=2)["status"] == "stopped"
    first = json.loads((run_dir(run) / "cb-rank0.json").read_text())
    assert first["n"] == 2 and first["resumed_from"] is None
    assert train(run, progress=False)["status"] == "completed"
    last = json.loads((run_dir(run) / "cb-rank0.json").read_text())
    assert last["resumed_from"] == 2 and last["n"] == 4  # its state came back from the checkpoint


def test_callbacks_are_built_on_every_rank(runs_dir, tiny_data, probe_importable):
    run = make_run_config(
        "preln", L=2, d_model=32, preset="tiny", max_steps=2, data=str(tiny_data), study="ranks", verbose=False,
        overrides=SMALL, callbacks=[PROBE], num_processes=2,
    )  # fmt: skip
    res = train(run, progress=False)  # accelerate launch, 2 gloo ranks
    assert res["status"] == "completed" and res["world_size"] == 2
    seen = [json.loads((run_dir(run) / f"probe-rank{r}.json").read_text()) for r in (0, 1)]
    assert [(s["n"], s["world"]) for s in seen] == [(2, 2), (2, 2)]


# --------------------------------------------------------------------------------- item 7: the shipped ablation study
def test_the_warmup_ablation_study_plans_runs_and_groups_by_the_swept_name(runs_dir, tiny_data, tmp_path, capsys):
    shipped = load_study("warmup-ablation")
    plan = expand_study(shipped)
    assert len(plan) == 8 and {(e.run.model.arch, e.run.model.n_layer) for e in plan} == {
        (a, L) for a in ("preln", "attnres") for L in (4, 8)
    }
    assert sorted(e.run.train.warmup_frac for e in plan) == [0.01] * 4 + [0.1] * 4
    # the same study, shortened to 2 steps of 4 x 32 tokens for CPU
    (g,) = shipped.groups
    short = dict(
        yaml.safe_load((REPO / "depthbench_nb" / "resources" / "studies" / "warmup-ablation.yaml").read_text()),
        data=str(tiny_data),
        groups=[dict(name=g.name, archs=list(g.archs), depths=list(g.depths), max_steps=2, set=dict(g.set, **SMALL))],
    )
    path = tmp_path / "warmup-ablation.yaml"
    path.write_text(yaml.safe_dump(short))
    spec = load_study(path)
    for e in expand_study(spec):
        assert train(e.run, progress=False)["status"] == "completed"
    df = collect(spec)
    assert "train.warmup_frac" in df and df["train.warmup_frac"].tolist() == [0.01, 0.1] * 4
    table = _collect_by(df, "train.warmup_frac")
    assert table["train.warmup_frac"].tolist() == [0.01, 0.1] and table.runs.tolist() == [4, 4]
    assert table.completed.tolist() == [4, 4]
    assert table.mean_final_val_loss.tolist() == pytest.approx(
        [df[df["train.warmup_frac"] == w].final_val_loss.mean() for w in (0.01, 0.1)]
    )
    capsys.readouterr()
    assert main(["collect", str(path), "--by", "train.warmup_frac", "--json"]) == 0
    assert [r["runs"] for r in json.loads(capsys.readouterr().out)["by"]] == [4, 4]
    assert main(["sweep", "status", str(path), "--by", "train.warmup_frac", "--json"]) == 0
    by_value = json.loads(capsys.readouterr().out)["by_value"]
    assert [(r["train.warmup_frac"], r["completed"]) for r in by_value] == [(0.01, 4), (0.1, 4)]
    assert main(["collect", str(path), "--by", "train.warmup"]) == 2
    assert "closest: train.warmup_frac" in capsys.readouterr().err
    # the DepthBench report's val-loss table: the swept name is a column, each (design, L) cell has both values; the
    # copy keeps the shipped name, and the report reads the file `collect` recorded (not the shipped 40-step plan)
    report_depthbench.build_depthbench_report(spec.name, out_dir=tmp_path / "report", related=[])
    val = pd.read_csv(tmp_path / "report" / "depthbench_val_loss.csv")
    cells = val.groupby(["arch", "n_layer"])["train.warmup_frac"].apply(sorted).to_dict()
    assert cells == {(a, L): [0.01, 0.1] for a in ("attnres", "preln") for L in (4, 8)}
    assert (val.n_replicates == 1).all()  # one seed per cell: nothing averaged across the two warmups


def test_a_study_group_set_is_checked_when_the_study_loads(tmp_path):
    group = dict(
        name="g", archs=["preln"], depths=[2], callbacks=[PROBE], set={"train.betas": [[0.9, 0.95], [0.8, 0.9]]}
    )
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(dict(name="s", preset="tiny", groups=[group])))
    plan = expand_study(load_study(path))
    assert [e.run.train.betas for e in plan] == [(0.9, 0.95), (0.8, 0.9)]  # a list of lists sweeps a list field
    assert all(e.run.callbacks == ({"path": PROBE, "args": {}},) for e in plan)
    with pytest.raises(Exception, match="closest: train.warmup_frac"):
        StudyGroup(name="g", archs=("preln",), set={"train.warmup": [0.1]})
    with pytest.raises(Exception, match="sweeps an empty list"):
        StudyGroup(name="g", archs=("preln",), set={"train.warmup_frac": []})
