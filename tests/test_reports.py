"""The report notebooks (20, 21) executed with papermill on run records made here, and reports of studies that
have nothing to show.

The fixture study holds real DepthBench runs (trained for 2 steps through `depthbench_nb.trainer`, CPU-sized, then
diagnosed with `depthbench_nb.diagnostics`, domain NLL included) and looped run records whose losses come from the
looped paper's law (written with `depthbench_nb.runs.write_params/write_result`: training 22 looped models would
take minutes here; the demo trains them for real). Every expected figure and table file must appear, no executed cell
may hold an error, and scale labels must say "NOT comparable".
"""

import json

import nbformat
import numpy as np
import pandas as pd
import pytest

from depthbench_nb import demo, report_depthbench, report_looped, report_cli, report_common
from depthbench_nb.config import ConfigError
from depthbench_nb.looped import looped_params
from depthbench_nb.runs import provenance, result_identity, run_dir, write_params, write_result
from depthbench_nb.run_params import make_run_config
from depthbench_nb.trainer import train
from looped_records import write_looped_record

STUDY = "report-fixture"
PAPER_LAW = dict(E=1.57, A=28.027, B=915.82, alpha=0.199, beta=0.369, phi=0.459)  # arXiv 2604.21106 Table 2


def small(run, steps=2):
    "A CPU-sized copy of a run: 4 sequences of 32 tokens per step, one validation batch."
    return run.replace(
        train=run.train.replace(max_steps=steps, seq_len=32, global_batch=4, eval_batches=1, eval_every=steps)
    )


def design_runs(data):
    "Real runs: every report section of the DepthBench report has data (2 depths, 2 LRs, HC/mHC, Block AttnRes)."
    specs = [
        ("preln", 2, {}, 2e-3),
        ("preln", 4, {}, 2e-3),
        ("preln", 4, {}, 4e-3),
        ("hc", 4, {}, 2e-3),
        ("mhc", 4, {}, 2e-3),
        ("attnres", 4, {}, 2e-3),
        ("block_attnres", 4, dict(attnres_num_blocks=4), 2e-3),
    ]  # 4 blocks of 2 sublayers: a partial sum
    return [
        small(
            make_run_config(a, L=L, d_model=32, preset="tiny", lr=lr, study=STUDY, data=str(data), verbose=False, **o)
        )
        for a, L, o, lr in specs
    ]


def looped_records(data, seed=0):
    """Looped records: r in {1,2,4} x s in {1,2,3} x 2 budgets (6 per r); truncated-BPTT and HC runs at r in {2, 4},
    s in {1, 2} of the first budget (with its 3 r = 1 runs: 7 points per case-study fit); an additive and a second-LR
    run."""
    rng = np.random.default_rng(seed)

    def loss(run, offset=0.0):
        p, r = looped_params(run.model), run.model.recurrence
        n_eff = p.n_once + r ** PAPER_LAW["phi"] * p.n_rec
        return float(
            PAPER_LAW["E"]
            + PAPER_LAW["A"] * n_eff ** -PAPER_LAW["alpha"]
            + PAPER_LAW["B"] * run.train.tokens ** -PAPER_LAW["beta"]
            + offset
            + 0.002 * rng.standard_normal()
        )

    def mk(**kw):
        return make_run_config("looped", preset="tiny", study=STUDY, data=str(data), verbose=False, **kw)

    for r in (1, 2, 4):
        for s in (1, 2, 3):
            for C in (5e11, 1e12):
                run = mk(r=r, s=s, C=C)
                write_looped_record(run, loss(run))
    for kw, off in ((dict(truncated_bptt=True), 0.02), (dict(injection="hc"), -0.01)):
        for r in (2, 4):
            for s in (1, 2):
                run = mk(r=r, s=s, C=5e11, **kw)
                write_looped_record(run, loss(run, off))
    for kw, off in ((dict(injection="additive"), 0.005), (dict(lr=7e-3), 0.03)):
        run = mk(r=2, s=1, C=5e11, **kw)
        write_looped_record(run, loss(run, off))


@pytest.fixture(scope="module")
def fixture_study(tmp_path_factory, tiny_data):
    with pytest.MonkeyPatch.context() as mp:
        root = tmp_path_factory.mktemp("report-runs")
        mp.setenv("DEPTHBENCH_RUNS", str(root))
        runs = design_runs(tiny_data)
        for run in runs:
            assert train(run, progress=False)["status"] == "completed"
        df = report_common.study_table(STUDY)
        done = demo._diagnose_study(STUDY, df, n_samples=2, seq_len=16, eval_limit=2, progress=False)
        assert len(done) == len(runs)
        looped_records(tiny_data)
        yield root


def test_report_notebooks_build_every_artifact(fixture_study, capsys):
    assert (
        report_cli.cli_report([STUDY, "--restarts", "4", "--bootstrap", "3", "--boot-restarts", "2", "--json"]) == 0
    )  # `depthbench-nb report STUDY`
    printed = json.loads(capsys.readouterr().out)
    out = fixture_study / STUDY / "report"
    assert printed["report_dir"] == str(out) and {f["file"] for f in printed["files"]} >= {
        "depthbench_index.md",
        "looped_index.md",
    }
    nbs = [out / "20_depthbench_report.ipynb", out / "21_looped_report.ipynb"]
    assert [str(n) for n in nbs] == printed["notebooks"]
    for nb_path in nbs:  # the executed notebooks are kept beside the artifacts, and no cell holds an error
        nb = nbformat.read(nb_path, as_version=4)
        errors = [
            o
            for c in nb.cells
            if c.cell_type == "code"
            for o in c.get("outputs", [])
            if o.get("output_type") == "error"
        ]
        assert not errors, errors
    expected_missing = {
        "looped_table10_extrapolation",  # needs the runs of Table 10's plan: said in the index instead
        "looped_downstream",
        "looped_downstream_matched",  # needs runs evaluated downstream (tests/test_looped_report.py)
        "depthbench_loss_across_scales",
        "looped_table5_injection",  # needs runs at Table 5's one cell (s = 10, r = 4, C = 1e18)
    }  # needs runs at two of the paper's scales (tests/test_depthbench_report.py)
    for stem in report_depthbench._DEPTHBENCH_ARTIFACTS + report_looped._LOOPED_ARTIFACTS:
        if stem in expected_missing:
            continue
        assert (out / f"{stem}.csv").exists() or (out / f"{stem}.png").exists(), stem
        if (out / f"{stem}.png").exists():
            assert (out / f"{stem}.svg").stat().st_size > 1000
        if (
            out / f"{stem}.csv"
        ).exists():  # every table states its scale: ours (not comparable), accounting or the paper's
            md = (out / f"{stem}.md").read_text()
            assert (
                md.count("NOT comparable")
                + md.count(report_common.ACCOUNTING_LABEL)
                + md.count(report_common.PAPER_LABEL)
            ) == 1, stem
    assert not any((out / f"{s}.csv").exists() for s in expected_missing)
    looped_index = (out / "looped_index.md").read_text()
    assert "extrapolation comparison (Table 10)" in looped_index and "NOT comparable" in looped_index
    db_index = (out / "depthbench_index.md").read_text()  # every other DepthBench section had data
    assert "not built: `depthbench_loss_across_scales`" in db_index and "loss across scales (Figure 3)" in db_index
    # tables hold what the records say
    val = pd.read_csv(out / "depthbench_val_loss.csv")
    assert set(val.arch) == {"preln", "hc", "mhc", "attnres", "block_attnres"} and not val.comparable.any()
    assert (
        val.what_differs.str.contains("no grid of the paper has the shape L").all() and val.paper_val_loss.isna().all()
    )  # tiny shapes
    assert val.set_index(["arch", "n_layer"]).loc[("preln", 4), "n_lrs"] == 2
    assert (
        len(pd.read_csv(out / "depthbench_paper_val_loss.csv")) == 54
    )  # Figure 2: 10 designs x 5 shapes + HC, AttnRes at L42, L70
    mix = pd.read_csv(out / "depthbench_mixing_erank.csv")
    assert (
        set(mix.arch) == {"hc", "mhc"}
        and ((mix.erank_sv >= 1) & (mix.erank_sv <= 4) & (mix.erank_sv2 <= mix.erank_sv + 1e-9)).all()
    )  # n = 4 streams
    dz = pd.read_csv(out / "depthbench_dead_zone.csv")
    assert list(dz.arch) == ["block_attnres"] and 0 <= dz.dead_zone_layers.iloc[0] <= 4
    t1 = pd.read_csv(out / "looped_table1_per_r.csv")
    assert sorted(t1.r) == [1, 2, 4] and (t1.n_points == 6).all() and (t1.provenance == "demo").all()
    t2 = pd.read_csv(out / "looped_table2_joint.csv").set_index("fit")
    assert t2.loc["phi_free", "n_points"] == 18 and t2.loc["phi_0", "phi"] == 0 and t2.loc["phi_1", "phi"] == 1
    assert t2.loc["phi_free", "paper_phi"] == 0.459 and t2.loc["phi_free", "restarts"] == 4
    assert (
        t2.loc["phi_free", "bootstrap_resamples"] == 3 and t2.loc["phi_free", "bootstrap_restarts"] == 2
    )  # the effort, stated
    assert "warm start" in t2.loc["phi_free", "effort"] and t2.loc["phi_free", "scale"].startswith(
        "reduced scale: 18 of 18 runs"
    )
    t3 = pd.read_csv(out / "looped_table3_case_studies.csv").set_index("fit")
    assert (
        t3.loc["tbptt", "n_points"] == 7 and t3.loc["tbptt", "n_r1"] == 3
    )  # its 4 runs + the 3 r = 1 runs of its budget
    assert (
        t3.loc["hc", "n_points"] == 7
        and t3.loc["baseline_refit", "n_points"] == 9
        and t3.loc["baseline_refit", "delta_phi"] == 0
    )
    assert "case study tbptt_without_r2" in looped_index  # 2 runs + 3 anchors: too few points for the law, said so
    runs = pd.read_csv(out / "looped_runs.csv")
    assert runs.scale.str.startswith("reduced scale: the paper has no run").all() and not runs.paper_scale.any()
    inj = pd.read_csv(
        out / "looped_table5_other_cells.csv"
    )  # tiny runs: none at Table 5's cell s = 10, r = 4, C = 1e18
    assert {"linear", "additive", "hc"} <= set(inj.injection) and not (out / "looped_table5_injection.csv").exists()
    assert (pd.read_csv(out / "looped_verdicts.csv").verdict == "reproduced").all()
    assert (pd.read_csv(out / "depthbench_verdicts.csv").verdict == "reproduced").all()


def test_cli_report_refuses_an_unknown_study(runs_dir):
    with pytest.raises(ConfigError, match="sweep run"):
        report_cli.cli_report(["no-such-study"])


def test_study_without_runs_says_what_is_missing(runs_dir, tmp_path):
    (runs_dir / "empty").mkdir(parents=True)
    for build, name in (
        (report_depthbench.build_depthbench_report, "depthbench"),
        (report_looped.build_looped_report, "looped"),
    ):
        build("empty", out_dir=tmp_path / "empty")
        index = (tmp_path / "empty" / f"{name}_index.md").read_text()
        assert "no run records" in index and "not built" in index and "## Missing" in index
        assert (tmp_path / "empty" / f"{name}_verdicts.csv").exists()  # accounting needs no runs


def test_study_with_only_failed_runs_and_missing_diagnostics(runs_dir, tmp_path, tiny_data):
    ok = small(
        make_run_config("preln", L=2, d_model=32, preset="tiny", study="broken", data=str(tiny_data), verbose=False)
    )
    assert train(ok, progress=False)["status"] == "completed"  # completed but never diagnosed
    bad = small(
        make_run_config("hc", L=2, d_model=32, preset="tiny", study="broken", data=str(tiny_data), verbose=False)
    )
    folder = run_dir(bad)
    folder.mkdir(parents=True)
    write_params(folder, bad)
    write_result(
        folder,
        dict(
            status="failed",
            **result_identity(bad),
            steps=0,
            tokens=0,
            final_val_loss=None,
            best_val_loss=None,
            wall_time_s=0.0,
            train_flops=None,
            params_total=None,
            params_backbone=None,
            provenance=provenance(),
            error="RuntimeError: boom",
        ),
    )
    rep = report_depthbench.build_depthbench_report("broken", out_dir=tmp_path)
    index = (tmp_path / "depthbench_index.md").read_text()
    assert "no diagnosed runs" in index and "depthbench-nb diagnose" in index
    failed = pd.read_csv(tmp_path / "depthbench_runs_not_completed.csv")
    assert list(failed.status) == ["failed"] and "boom" in failed.error.iloc[0]
    assert {
        "depthbench_val_loss",
        "depthbench_loss_vs_ratio",
    } <= rep.built()  # what the completed run allows is still built


def test_demo_refuses_bad_workers():
    with pytest.raises(ConfigError, match="--workers"):
        demo.cli_demo(["--workers", "0"])


def test_demo_extras_complete_the_looped_grid():
    "The demo's extra looped runs give 6 points per r (Table 1) and one run per case study, without repeating a run."
    from depthbench_nb.sweep import expand_study, load_study

    planned = expand_study(load_study("demo"))
    extra = demo._demo_extra_entries()
    assert not {e.run_id for e in planned} & {e.run_id for e in extra}
    looped = [e.run.model for e in planned + extra if e.run.model.arch == "looped"]
    base = [m for m in looped if report_looped._looped_variant(m) == "baseline"]
    assert all(sum(m.recurrence == r for m in base) >= 6 for r in (1, 2, 4))
    assert {report_looped._looped_variant(m) for m in looped} == {"baseline", "tbptt", "hc", "additive"}
    for v in (
        "tbptt",
        "hc",
    ):  # each case study: r in {2, 4} x s in {1, 2} at the first budget, + 3 r = 1 runs there: 7 points
        assert sorted((m.recurrence, m.d_model) for m in looped if report_looped._looped_variant(m) == v) == [
            (2, 64),
            (2, 128),
            (4, 64),
            (4, 128),
        ]
    designs = {e.run.model.arch for e in planned} - {"looped"}
    assert {"preln", "hc", "mhc", "attnres", "block_attnres"} <= designs
