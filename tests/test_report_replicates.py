"""Replicates and ablations in the reports, on run records made here (params.json + result.json + metrics.jsonl, as
the trainer leaves them): seeds averaged per cell (mean, sample std, n), the best LR chosen by the mean, an
ablation's swept names (the records' `overrides`) as table columns and figure facets, `--by` any dotted name, runs
that left the paper grid (`off_grid`) not comparable, and the costs read from result.json's summaries."""

import json
import statistics

import pandas as pd
import pytest
import yaml

from depthbench_nb import report_cli, report_common, report_depthbench, report_looped
from depthbench_nb.cli import main
from depthbench_nb.config import ConfigError
from depthbench_nb.run_params import make_run_config
from depthbench_nb.runs import run_dir, write_params
from depthbench_nb.run_params import RunParams
from depthbench_nb.sweep import expand_study, load_study
from looped_records import write_looped_record
from test_depthbench_report import record, write_record

STUDY = "replicates"
# 400m L16, three seeds per LR: the best single run (2.80) is at LR 2e-3, the best mean (2.85) at 4e-3
LOSSES = {2e-3: [2.80, 2.90, 2.90], 4e-3: [2.84, 2.85, 2.86]}


def seeded_records():
    for lr, losses in LOSSES.items():
        for seed, loss in enumerate(losses):
            record("preln", 16, "400m", loss, study=STUDY, lr=lr, seed=seed)


def test_three_seeds_per_cell_report_mean_spread_and_n(runs_dir, tmp_path):
    seeded_records()
    rep = report_depthbench.build_depthbench_report(STUDY, out_dir=tmp_path, related=[])
    val = pd.read_csv(tmp_path / "depthbench_val_loss.csv")
    assert len(val) == 1  # one cell, not one row per seed
    row = val.iloc[0]
    best_run_lr = min(((loss, lr) for lr, losses in LOSSES.items() for loss in losses))[1]
    best_mean_lr = min(LOSSES, key=lambda lr: statistics.mean(LOSSES[lr]))
    assert (best_run_lr, best_mean_lr) == (2e-3, 4e-3)  # the records make the two choices differ
    assert row.best_lr == best_mean_lr
    assert row.val_loss == pytest.approx(statistics.mean(LOSSES[4e-3]))
    assert row.val_loss_std == pytest.approx(statistics.stdev(LOSSES[4e-3]))  # sample std (ddof 1)
    assert (row.n_replicates, row.n_lrs, row.lrs_swept) == (3, 2, "0.002, 0.004")
    md = (tmp_path / "depthbench_val_loss.md").read_text()
    assert "mean over the cell's replicates" in md and "sample standard deviation" in md
    assert "winning LRs: {0.004}" in dict(rep.artifacts)["depthbench_loss_vs_ratio.png"]


def ablation_record(loss, warmup, seed=0, off_grid=False, **options):
    "A 400m L16 record of a warmup ablation: params.json records the override as the trainer will (`overrides`)."
    run, folder = record("preln", 16, "400m", loss, study=STUDY, seed=seed, **options)
    if warmup is not None:
        moved = run.replace(train=run.train.replace(warmup_frac=warmup))
        folder.rename(run_dir(moved))
        run, folder = moved, run_dir(moved)
        (folder / "params.json").unlink()  # rewritten below for the moved run
        result = json.loads((folder / "result.json").read_text())  # a record names its folder's run
        (folder / "result.json").write_text(json.dumps(dict(result, run_id=moved.run_id)))
    overrides = {"train.warmup_frac": warmup} if warmup is not None else {}
    if off_grid:  # recorded as apply_overrides records it; the run's seq_len stays, so its id is unchanged
        run = run.replace(overrides=dict(overrides, **{"train.seq_len": 4096}), off_grid=("train.seq_len",))
    else:
        run = run.replace(overrides=overrides)
    write_params(folder, run)
    return run


def test_an_ablations_swept_name_is_a_column_and_a_facet(runs_dir, tmp_path, monkeypatch):
    for w, losses in ((0.01, [2.9, 2.8]), (0.05, [2.7, 2.75])):
        for seed, loss in enumerate(losses):
            ablation_record(loss, w, seed=seed)
    panels = {}
    original = report_common.Report.figure

    def keep_titles(self, fig, name, caption):
        panels[name] = [ax.get_title() for ax in fig.axes]
        return original(self, fig, name, caption)

    monkeypatch.setattr(report_common.Report, "figure", keep_titles)
    report_depthbench.build_depthbench_report(STUDY, out_dir=tmp_path, related=[])
    val = pd.read_csv(tmp_path / "depthbench_val_loss.csv")
    assert list(val.columns[:5]) == ["arch", "preset", "n_layer", "d_model", "train.warmup_frac"]  # after the shape
    val = val.set_index("train.warmup_frac")
    assert sorted(val.index) == [0.01, 0.05]
    assert val.loc[0.01, "val_loss"] == pytest.approx(2.85) and val.loc[0.05, "val_loss"] == pytest.approx(2.725)
    assert (val.n_replicates == 2).all()
    fig2 = panels["depthbench_loss_vs_ratio"]
    assert "preset 400m\ntrain.warmup_frac=0.01" in fig2 and "preset 400m\ntrain.warmup_frac=0.05" in fig2


def test_by_groups_older_records_and_refuses_unknown_names(runs_dir, tmp_path, monkeypatch, capsys):
    "Records made before `overrides` sweep nothing; `--by` groups them by any dotted name; a typo names the closest."
    ablation_record(2.9, None, seed=0)
    ablation_record(2.8, None, seed=1)
    (tmp_path / "a").mkdir()
    report_depthbench.build_depthbench_report(STUDY, out_dir=tmp_path / "a", related=[])
    val = pd.read_csv(tmp_path / "a" / "depthbench_val_loss.csv")
    assert "train.seed" not in val and len(val) == 1 and val.n_replicates[0] == 2
    report_depthbench.build_depthbench_report(STUDY, out_dir=tmp_path / "b", related=[], by=["train.seed"])
    val = pd.read_csv(tmp_path / "b" / "depthbench_val_loss.csv")
    assert list(val["train.seed"]) == [0, 1] and (val.n_replicates == 1).all()
    with pytest.raises(ConfigError, match="closest: train.warmup_frac"):
        report_depthbench.build_depthbench_report(STUDY, out_dir=tmp_path / "c", related=[], by=["train.warmup"])
    assert main(["report", STUDY, "--by", "train.warmup"]) == 2  # before any notebook runs
    seen = {}
    (runs_dir / STUDY / "report").mkdir()
    monkeypatch.setattr(
        report_cli, "run_report_notebooks", lambda study, which, params, progress: seen.update(params) or []
    )
    report_cli.cli_report([STUDY, "--by", "train.seed", "--json"])
    assert seen["by"] == ["train.seed"]  # the notebooks' `by` parameter


def test_a_run_off_the_paper_grid_is_shown_not_comparable(runs_dir, tmp_path):
    ablation_record(2.7, 0.01, off_grid=True)  # otherwise the paper's 400M L16 setting
    ablation_record(2.8, None)
    report_depthbench.build_depthbench_report(STUDY, out_dir=tmp_path, related=[])
    val = pd.read_csv(tmp_path / "depthbench_val_loss.csv").set_index("val_loss")
    assert val.loc[2.8, "comparable"] and pd.isna(val.loc[2.8, "what_differs"])
    moved = val.loc[2.7]
    assert not moved.comparable  # shown, labelled, never counted as the paper's run
    assert "left the paper grid (set: train.seq_len=4,096)" in moved.what_differs


def test_costs_come_from_result_summaries_and_older_records_from_metrics(runs_dir, tmp_path):
    new_run, new = record("preln", 16, "400m", 2.8, study=STUDY, seed=0)
    old_run, old = record("preln", 16, "400m", 2.9, study=STUDY, seed=1)
    res = json.loads((new / "result.json").read_text())
    # summaries unlike the metrics lines (1001, 1002; 50 tok/s): the table shows the result's, not a parse of the lines
    res.update(peak_mem_bytes=7, tokens_per_s_median=123.0)
    (new / "result.json").write_text(json.dumps(res))
    (new / "metrics.jsonl").write_text("not json, never read\n")
    report_depthbench.build_depthbench_report(STUDY, out_dir=tmp_path, related=[])
    costs = pd.read_csv(tmp_path / "depthbench_costs_measured.csv")
    assert sorted(zip(costs.peak_mem_bytes, costs.tokens_per_s_median)) == [(7, 123.0), (1002, 50.0)]


def test_looped_cells_are_replicate_means(runs_dir, tmp_path):
    "The looped fits' points: one per cell, the mean over its seeds at the LR of the lowest mean, with std and n."
    losses = {1e-3: [2.60, 2.90, 2.92], 2e-3: [2.70, 2.71, 2.72]}
    for lr, ls in losses.items():
        for seed, loss in enumerate(ls):
            run = make_run_config(
                "looped", preset="looped", r=4, s=10, C=1e18, study="looped-seeds", lr=lr, seed=seed, verbose=False
            )
            write_looped_record(run, loss)
    lf = report_looped._looped_frame(report_common.study_table("looped-seeds"))
    assert len(lf) == 6 and sorted(set(lf.seed)) == [0, 1, 2]
    base = report_looped._best_per_cell(lf)
    assert len(base) == 1
    cell = base.iloc[0]
    assert cell.lr == 2e-3 and cell.loss == pytest.approx(statistics.mean(losses[2e-3]))
    assert cell.loss_std == pytest.approx(statistics.stdev(losses[2e-3])) and cell.n_replicates == 3
    report_looped.build_looped_report("looped-seeds", out_dir=tmp_path, restarts=2, n_bootstrap=0)
    table = pd.read_csv(tmp_path / "looped_cell_means.csv")
    assert list(table.n_replicates) == [3] and table.loss[0] == pytest.approx(2.71)
    # an ablation of the same cell (warmup 0.05, set as an override): its own cell, a column of the table
    for seed, loss in enumerate([2.5, 2.6]):
        run = make_run_config(
            "looped", preset="looped", r=4, s=10, C=1e18, study="looped-seeds", lr=2e-3, seed=seed, verbose=False
        )
        run = run.replace(train=run.train.replace(warmup_frac=0.05), overrides={"train.warmup_frac": 0.05})
        write_looped_record(run, loss)
    base = report_looped._best_per_cell(report_looped._looped_frame(report_common.study_table("looped-seeds")))
    assert sorted(zip(base["train.warmup_frac"], base.n_replicates, base.loss.round(6))) == [
        (0.0, 3, 2.71),
        (0.05, 2, 2.55),
    ]


def test_a_study_marks_replicates_and_the_report_averages_them(runs_dir, tmp_path, capsys):
    "A group's `replicates:` (here a swept init seed): in each planned run's params.json, outside the run id, averaged."
    group = dict(name="inits", archs=["preln"], depths=[16], lrs=[2e-3], set={"train.init_seed": [0, 1]})

    def plan(**extra):
        path = tmp_path / "inits.yaml"
        path.write_text(yaml.safe_dump(dict(name=STUDY, preset="400m", groups=[dict(group, **extra)])))
        return expand_study(load_study(path))

    marked, unmarked = plan(replicates=["train.init_seed"]), plan()
    assert [e.run_id for e in marked] == [e.run_id for e in unmarked]  # never part of the run id
    assert [e.run.train.init_seed for e in marked] == [0, 1] and all(e.run.off_grid == () for e in marked)
    # the papermill executor's parameters and the python executor's RunConfig both carry the names
    assert all(RunParams.of(**e.params).notebook_values()["replicates"] == ["train.init_seed"] for e in marked)
    assert "replicates" not in unmarked[0].run.to_dict()  # absent when empty: older records unchanged
    folders = [write_record(e.run, loss) for e, loss in zip(marked, (2.80, 2.90))]
    assert [json.loads((f / "params.json").read_text())["replicates"] for f in folders] == [["train.init_seed"]] * 2
    report_depthbench.build_depthbench_report(STUDY, out_dir=tmp_path / "marked", related=[])
    val = pd.read_csv(tmp_path / "marked" / "depthbench_val_loss.csv")
    assert "train.init_seed" not in val and len(val) == 1  # one cell: the init seeds are its replicates
    assert val.val_loss[0] == pytest.approx(2.85) and val.n_replicates[0] == 2
    assert val.val_loss_std[0] == pytest.approx(statistics.stdev([2.80, 2.90]))
    # the same runs unmarked (params.json without the key): the init seed is a swept name, a cell per value
    for e, f in zip(unmarked, folders):
        write_params(f, e.run)
    report_depthbench.build_depthbench_report(STUDY, out_dir=tmp_path / "unmarked", related=[])
    val = pd.read_csv(tmp_path / "unmarked" / "depthbench_val_loss.csv")
    assert list(val["train.init_seed"]) == [0, 1] and list(val.n_replicates) == [1, 1]
    # a name that is no config field: the closest ones, from the study and from the train command (exit 2)
    with pytest.raises(ConfigError, match="group 'inits', replicates: unknown config name.*closest: train.init_seed"):
        plan(replicates=["train.init_sed"])
    with pytest.raises(ConfigError, match="replicates must be a list of dotted config names"):
        plan(replicates=7)
    assert main(["train", "--arch", "preln", "--L", "4", "--preset", "tiny", "--replicate", "train.init_sed"]) == 2
    assert "closest: train.init_seed" in capsys.readouterr().err
