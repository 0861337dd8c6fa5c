"""The looped report computes the paper's tables the way the paper does, on run records made here at the paper's
grids (arXiv 2604.21106): Table 3's case studies on their runs plus the r = 1 runs of their budgets (HC: 83 runs),
those r = 1 runs shared with `looped-main` by run id, the baseline refit and delta phi, TBPTT without r = 2; Fig. 3
from the per-r laws; scale labels from the runs; the paper's fitting effort by default; bad input.

The records are written with `runs.write_params/write_result` (tests/looped_records.py) at the `looped` preset's exact
shapes and budgets (248 runs of the paper would take GPU-years); their losses come from the paper's law with each
variant's phi plus noise.
"""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from depthbench_nb import report_depthbench, report_looped, report_cli, report_common, scaling
from depthbench_nb.config import (
    ARCHS,
    FAMILIES,
    ConfigError,
    Family,
    recipe_designs,
    register_design,
    register_family,
    unregister_design,
)
from depthbench_nb.looped import CASE_STUDY_BUDGETS, looped_grid_rows, looped_params
from depthbench_nb.runs import run_dir
from depthbench_nb.sweep import expand_study, load_study, plan_rows
from depthbench_nb.run_params import make_run_config
from looped_records import write_looped_record

LAW = dict(E=1.56773, A=28.027, B=915.82, alpha=0.19924, beta=0.36863)  # the project page's fit
PHI = {"baseline": 0.459, "hc": 0.646, "tbptt": 0.380}  # Table 2 and Table 3
RESTARTS = 24


def grid_run(study: str, row: dict):
    opts = (
        dict(truncated_bptt=True)
        if row["r_bwd"] < row["r"]
        else dict(injection="hc")
        if row["injection"] == "hc"
        else {}
    )
    return make_run_config(
        "looped", preset="looped", r=row["r"], s=row["s"], C=row["C"], study=study, verbose=False, **opts
    )


def law_loss(run, phi: float, rng) -> float:
    p = looped_params(run.model)
    n_eff = p.n_once + run.model.recurrence**phi * p.n_rec
    return float(
        LAW["E"]
        + LAW["A"] * n_eff ** -LAW["alpha"]
        + LAW["B"] * run.train.tokens ** -LAW["beta"]
        + 0.003 * rng.standard_normal()
    )


@pytest.fixture(scope="module")
def paper_studies(tmp_path_factory):
    "looped-main (116 runs), looped-hc (63) and looped-tbptt (69), as their shipped studies plan them."
    with pytest.MonkeyPatch.context() as mp:
        root = tmp_path_factory.mktemp("paper-runs")
        mp.setenv("DEPTHBENCH_RUNS", str(root))
        rng = np.random.default_rng(0)
        for study, variant in (("looped-main", "baseline"), ("looped-hc", "hc"), ("looped-tbptt", "tbptt")):
            planned = {e.run_id for e in expand_study(load_study(study))}
            for row in looped_grid_rows(variant):
                if row["reused"]:
                    continue  # the case studies' r = 1 rows are looped-main's runs
                run = grid_run(study, row)
                assert run.run_id in planned  # exactly the runs the shipped study plans
                write_looped_record(run, law_loss(run, PHI[variant], rng))
        yield root


def test_case_studies_are_fitted_with_their_r1_anchors(paper_studies, tmp_path):
    rep = report_looped.build_looped_report("looped-hc", out_dir=tmp_path, restarts=RESTARTS, n_bootstrap=0)
    t3 = pd.read_csv(tmp_path / "looped_table3_case_studies.csv").set_index("fit")
    assert t3.loc["hc", "n_points"] == 83 and t3.loc["hc", "n_r1"] == 20  # 63 HC runs + the r = 1 runs of 4 budgets
    assert t3.loc["baseline_refit", "n_points"] == 80 and t3.loc["baseline_refit", "n_r1"] == 20
    assert (
        t3.loc["hc", "budgets"]
        == t3.loc["baseline_refit", "budgets"]
        == ", ".join(f"{c:.3g}" for c in CASE_STUDY_BUDGETS)
    )
    # the law these records came from: phi 0.646 with HC, 0.459 without; delta phi measured against the refit
    assert abs(t3.loc["hc", "phi"] - 0.646) < 0.05 and abs(t3.loc["baseline_refit", "phi"] - 0.459) < 0.05
    assert t3.loc["hc", "delta_phi"] == pytest.approx(t3.loc["hc", "phi"] - t3.loc["baseline_refit", "phi"])
    assert t3.loc["hc", "paper_phi"] == 0.646 and t3.loc["hc", "paper_delta_phi"] == pytest.approx(0.646 - 0.453)
    assert (t3.scale == "paper scale").all() and (t3.provenance == "real").all()
    # the anchors are looped-main's runs, found by run id: the planned r = 1 rows of the HC grid
    lf = pd.read_csv(tmp_path / "looped_runs.csv")
    anchors = report_looped._case_study_frame(lf, "hc")
    anchors = anchors[anchors.r == 1]
    planned = {grid_run("looped-main", row).run_id for row in looped_grid_rows("hc") if row["reused"]}
    assert set(anchors.run_id) == planned and set(anchors.study) == {"looped-main"}
    assert not any(e.run.model.recurrence == 1 for e in expand_study(load_study("looped-hc")))  # never trained twice
    assert {"looped_table3_case_studies", "looped_fig10_case_study_residuals"} <= rep.built()
    index = (tmp_path / "looped_index.md").read_text()
    assert "no completed baseline looped runs" in index  # Tables 1/2 belong to looped-main's report


def test_looped_main_report(paper_studies, tmp_path):
    "looped-main's report: Tables 1, 2, 7, Fig. 3 from the per-r laws, and the case studies of the studies reusing it."
    rep = report_looped.build_looped_report("looped-main", out_dir=tmp_path, restarts=RESTARTS, n_bootstrap=0)
    t3 = pd.read_csv(tmp_path / "looped_table3_case_studies.csv").set_index("fit")
    assert (
        t3.loc["tbptt", "n_points"] == 89
        and t3.loc["tbptt_without_r2", "n_points"] == 66
        and t3.loc["hc", "n_points"] == 83
    )
    assert (t3.n_r1 == 20).all()  # every case-study fit has its r = 1 anchors
    assert t3.loc["tbptt_without_r2", "recurrences"] == "1, 4, 8" and abs(t3.loc["tbptt", "phi"] - 0.38) < 0.06
    t2 = pd.read_csv(tmp_path / "looped_table2_joint.csv").set_index("fit")
    assert t2.loc["phi_free", "n_points"] == 116 and abs(t2.loc["phi_free", "phi"] - 0.459) < 0.03
    t7 = pd.read_csv(tmp_path / "looped_table7_residuals.csv")
    assert list(t7.r) == ["1", "2", "4", "8", "all"] and (t7.rmse < 0.006).all() and t7.paper_rmse.notna().all()
    # Fig. 3 comes from the per-r laws: the exponents are those of each r's own fit, not of the joint law
    lf = pd.read_csv(tmp_path / "looped_runs.csv")
    base = lf[(lf.study == "looped-main")]
    per_r = scaling._fit_per_r(base.assign(provenance="real"), restarts=RESTARTS)
    paper = report_common.reference_table("looped")
    mine = report_looped._frontier_exponents(per_r, base, paper, report_looped._per_r_frontier(per_r, base)).set_index(
        "r"
    )
    shown = pd.read_csv(tmp_path / "looped_frontier_exponents.csv").set_index("r")
    assert np.allclose(shown.a_N_star, mine.a_N_star, rtol=1e-6) and np.allclose(
        shown.b_D_star, mine.b_D_star, rtol=1e-6
    )
    for (
        r,
        f,
    ) in per_r.items():  # the paper's definition: the closed form under C = k N^gamma D, gamma over the r's 11 widths
        gamma = np.polyfit(
            np.log(base[base.r == r].groupby("d_model").apply(lambda g: g.n_once.iloc[0] + g.n_rec.iloc[0])),
            np.log(base[base.r == r].groupby("d_model").flops_per_token.first()),
            1,
        )[0]
        assert shown.loc[r, "gamma"] == pytest.approx(gamma, rel=1e-9)
        assert shown.loc[r, "a_N_star"] == pytest.approx(f.beta / (f.alpha + gamma * f.beta), rel=1e-9)
    joint = scaling.fit_frame(base.assign(provenance="real"), "looped", restarts=RESTARTS)
    via_joint = report_looped._frontier_exponents({r: joint for r in per_r}, base, paper)
    assert not np.allclose(via_joint.set_index("r").b_D_star, shown.b_D_star, atol=1e-3)
    assert ((shown.a_N_star + shown.b_D_star) > 1.0).all() and shown.paper_b_D_star.tolist() == [0.53, 0.42, 0.37, 0.44]
    assert shown.a_exact_frontier.notna().all() and (shown.n_widths == 11).all()
    fr = pd.read_csv(tmp_path / "looped_frontier.csv")
    assert fr.C.min() == pytest.approx(4.64e17) and fr.C.max() == pytest.approx(2.15e19) and not fr.extrapolated.any()
    assert {
        "looped_table1_per_r",
        "looped_fig8_joint_residuals",
        "looped_fig9_per_r_residuals",
        "looped_frontier",
        "looped_stability",
    } <= rep.built()
    assert (
        rep.scale.n_runs == 248
        and rep.scale.n_comparable == 248
        and "all 248 completed runs are paper scale" in rep.scale.label
    )
    # Table 1 carries the paper's A, B and Huber beside ours; the empirical optima the paper's N* and L* (project page)
    t1 = pd.read_csv(tmp_path / "looped_table1_per_r.csv").set_index("r")
    assert (
        t1.loc[1, ["paper_A", "paper_B", "paper_huber"]].tolist() == [58, 150, 5.84e-5] and t1.loc[8, "paper_B"] == 780
    )
    emp = pd.read_csv(tmp_path / "looped_empirical_optima.csv")
    cell = emp[(emp.r == 4) & (emp.C.sub(1e19).abs() < 1e9)].iloc[0]
    assert cell.paper_N_star == pytest.approx(183.437985e6) and cell.paper_L_star == pytest.approx(2.458229, abs=1e-6)
    # the index lists every table and figure of the paper, each rebuilt / with a stated difference / partial / missing
    # and why
    index = pd.read_csv(tmp_path / "looped_paper_index.csv").set_index("paper")
    assert {
        "Table 1",
        "Table 2",
        "Table 3",
        *(f"Table {n}" for n in range(1, 11)),
        *(f"Fig. {n}" for n in range(1, 11)),
        "iso-FLOPs teaser (unnumbered)",
        "width result",
        "worked example",
        "downstream results",
    } <= set(index.index)
    assert set(index.status) <= set(report_common._PAPER_STATUSES)
    assert index[index.status != "rebuilt"].detail.fillna("").ne("").all()  # every other status says why
    assert index.loc["Table 1", "status"] == "rebuilt" and index.loc["Table 7", "status"] == "rebuilt"
    assert (
        index.loc["Table 2", "status"] == "partial" and "the phi CI (n_bootstrap = 0" in index.loc["Table 2", "detail"]
    )
    assert (
        index.loc["Table 3", "status"] == "rebuilt"
        and index.loc["Fig. 3", "status"] == "rebuilt with a stated difference"
    )
    assert (
        index.loc["Table 10", "status"] == "missing"
        and "sweep run looped-extrapolation" in index.loc["Table 10", "detail"]
    )
    assert (
        index.loc["downstream results", "status"] == "missing"
        and "depthbench-nb downstream" in index.loc["downstream results", "detail"]
    )
    assert index.loc["Table 5", "status"] == "missing" and "single injection" in index.loc["Table 5", "detail"]
    assert (
        index.loc["Fig. 5", "status"] == "missing"
        and "do not say what this figure shows" in index.loc["Fig. 5", "detail"]
    )
    # the claims: each headline claim with its artifact, read off this report's tables (records from the paper's law)
    claims = pd.read_csv(tmp_path / "looped_claims.csv").set_index("claim")
    assert claims.filter(like="phi = 0.46", axis=0).verdict.iloc[0] == "reproduced"
    assert claims.filter(like="hyperconnections raise phi", axis=0).verdict.iloc[0] == "reproduced"
    assert (claims.filter(like="should be wider", axis=0).verdict == "reproduced").all()  # paper's and fitted law
    assert claims.filter(like="extrapolation", axis=0).verdict.iloc[0].startswith("not built")
    width = pd.read_csv(tmp_path / "looped_width_verdicts.csv")
    assert {"fitted: tbptt (Table 3)", "fitted: hc (Table 3)"} <= set(width.law)
    # the stability refits: all six budgets, so the paper's split, said in the caption
    assert "the paper's split, C <= 2.15e18 and C >= 4.64e18" in (tmp_path / "looped_stability.md").read_text()
    text = (tmp_path / "looped_index.md").read_text()
    assert "## The paper's tables and figures" in text and "| Table 9 | rebuilt with a stated difference |" in text


def test_scale_comes_from_the_runs(tmp_path, monkeypatch):
    "A looped-preset run capped at 20 steps, or stopped early, is not paper scale; the table says what differs."
    monkeypatch.setenv("DEPTHBENCH_RUNS", str(tmp_path / "runs"))
    full = make_run_config("looped", preset="looped", r=4, s=10, C=1e18, study="scales", verbose=False)
    capped = make_run_config("looped", preset="looped", r=4, s=12, C=1e18, study="scales", max_steps=20, verbose=False)
    short = make_run_config("looped", preset="looped", r=2, s=10, C=1e18, study="scales", verbose=False)
    write_looped_record(full, 2.8)
    write_looped_record(capped, 3.1)
    write_looped_record(short, 2.9, steps=100)
    lf = report_looped._looped_frame(report_common.study_table("scales")).set_index("run_id")
    assert lf.loc[full.run_id, "scale"] == "paper scale" and lf.loc[full.run_id, "paper_scale"]
    assert (
        lf.loc[capped.run_id, "scale"].startswith("reduced scale: planned tokens")
        and "20 steps completed" in lf.loc[capped.run_id, "scale"]
    )
    assert lf.loc[short.run_id, "scale"] == "reduced scale: 100 steps completed (the paper: 3,677)"
    rep = report_looped.build_looped_report("scales", out_dir=tmp_path / "report", restarts=2, n_bootstrap=0)
    assert rep.scale.n_comparable == 1 and "1 of 3 completed runs are paper scale" in rep.scale.label


def test_case_study_without_r1_runs_is_a_clear_error(paper_studies, tmp_path):
    lf = report_looped._looped_frame(
        pd.concat([report_common.study_table("looped-hc")])
    )  # the HC runs alone, without looped-main
    with pytest.raises(
        ConfigError, match=r"no r = 1 runs at its budgets C = 4\.64e\+17, 1e\+18, 2\.15e\+18, 4\.64e\+18"
    ):
        report_looped._case_study_frame(lf, "hc")
    report_looped.build_looped_report("looped-hc", out_dir=tmp_path, restarts=2, n_bootstrap=0, related=[])
    index = (tmp_path / "looped_index.md").read_text()
    assert "case study hc (Table 3)" in index and "no r = 1 runs at its budgets" in index and "looped-main" in index


def test_fit_on_the_box_edge_is_said_in_words():
    "Runs that do not identify the law (phi on the box's edge): Table 2 says so instead of printing an interval."
    syn = scaling.synthetic_looped_frame(dict(scaling.PAPER_LOOPED, phi=3.5), noise=0.0, seed=0)
    joint = scaling.fit_frame(syn, "looped", restarts=4)
    scaling.attach_bootstrap(
        joint, scaling.block_bootstrap(syn, "looped", n_resamples=3, restarts=2, warm_start=joint, workers=1)
    )
    t2 = report_looped._table2_rows({"phi_free": (joint, syn)}, report_common.reference_table("looped")).set_index(
        "fit"
    )
    assert not t2.loc["phi_free", "identified"] and "do not identify the law" in t2.loc["phi_free", "note"]
    assert t2.loc["phi_free", "phi_ci"].startswith("these 116 runs do not identify") and np.isnan(
        t2.loc["phi_free", "phi_ci_low"]
    )
    assert t2.loc["phi_free", "bootstrap_resamples"] == 3 and t2.loc["phi_free", "best_from_warm_start"] >= 0
    good = scaling.fit_frame(scaling.synthetic_looped_frame(seed=1), "looped", restarts=8)
    scaling.attach_bootstrap(
        good,
        scaling.block_bootstrap(
            scaling.synthetic_looped_frame(seed=1), "looped", n_resamples=4, restarts=4, warm_start=good, workers=1
        ),
    )
    t2 = report_looped._table2_rows({"phi_free": (good, syn)}, report_common.reference_table("looped")).set_index("fit")
    lo, hi = good.ci["phi"]
    assert t2.loc["phi_free", "phi_ci"] == f"[{lo:.3f}, {hi:.3f}]" and t2.loc["phi_free", "note"] == ""


def test_report_command_defaults_to_the_papers_effort(runs_dir, monkeypatch, capsys):
    (runs_dir / "some-study" / "report").mkdir(parents=True)
    seen = {}
    monkeypatch.setattr(
        report_cli, "run_report_notebooks", lambda study, which, params, progress: seen.update(params) or []
    )
    assert (
        report_cli.cli_report(["some-study", "--only", "looped", "--json"]) == 1
    )  # no completed run: nothing reported
    assert seen == dict(restarts=500, n_bootstrap=200, bootstrap_restarts=500, seed=0, workers=None)
    json.loads(capsys.readouterr().out)
    with pytest.raises(ConfigError, match="--bootstrap"):
        report_cli.cli_report(["some-study", "--bootstrap", "1"])


def test_fig3_exponents_from_the_papers_table1():
    """The paper's own Table 1 coefficients give its Fig. 3 exponents under the report's definition, to 0.02 (the old
    one: no)."""
    paper = report_common.reference_table("looped")
    laws = report_looped._paper_table1_laws(paper)
    grid = scaling.paper_grid_frame().assign(vocab=32064, seq_len=2048)
    ex = report_looped._frontier_exponents(laws, grid, paper, report_looped._per_r_frontier(laws, grid)).set_index("r")
    assert ex.paper_a_N_star.tolist() == [0.57, 0.70, 0.76, 0.67] and ex.paper_b_D_star.tolist() == [
        0.53,
        0.42,
        0.37,
        0.44,
    ]
    assert (ex.a_N_star - ex.paper_a_N_star).abs().max() <= 0.02 and (
        ex.b_D_star - ex.paper_b_D_star
    ).abs().max() <= 0.02
    # the slopes of the exact frontier (the report's definition before) miss them by more than 0.05
    assert ((ex.a_exact_frontier - ex.paper_a_N_star).abs() > 0.05).all()


def test_phi_refitted_on_the_papers_optima(tmp_path):
    """The joint law refitted on the paper's 24 published per-(C, r) optima lands inside the paper's CI, as scipy's
    loop finds it."""
    paper = report_common.reference_table("looped")
    frame = report_looped._paper_optima_frame(paper)
    opt = report_looped._paper_optima(paper)
    assert len(frame) == 24 and np.allclose(frame.n_once + frame.n_rec, opt.N_star, rtol=1e-9)
    from depthbench_nb.scaling import paper_accounting

    assert np.allclose(
        frame.D, [C / paper_accounting(d, r).flops_per_token for C, d, r in zip(frame.C, frame.d, frame.r)]
    )
    cols = ["n_once", "n_rec", "r", "D", "loss", "provenance"]
    ours = scaling.fit_frame(frame[cols], "looped", restarts=50)
    ref = scaling.fit_frame(
        frame[cols], "looped", restarts=100, method="scipy"
    )  # the paper's L-BFGS-B loop, tight tolerances
    assert (
        0.41 <= ours.phi <= 0.53
        and ours.phi == pytest.approx(ref.phi, abs=1e-4)
        and ours.huber <= ref.huber * (1 + 1e-6)
    )
    report_looped.build_looped_report("no-runs", df=pd.DataFrame(), out_dir=tmp_path, restarts=50, n_bootstrap=0)
    t = pd.read_csv(tmp_path / "looped_phi_on_paper_optima.csv").iloc[0]
    assert (
        t.phi == pytest.approx(ours.phi, abs=1e-4)
        and t.n_points == 24
        and t.paper_phi == 0.459
        and t.paper_phi_ci == "[0.41, 0.53]"
    )
    v = pd.read_csv(tmp_path / "looped_verdicts.csv").set_index("quantity")
    assert v.loc["phi refitted on the paper's 24 per-(C, r) optima", "verdict"] == "reproduced"
    # every coefficient beside Table 2: phi inside the paper's CI, E, alpha and beta 30-40% off, said in the verdict
    coef = pd.read_csv(tmp_path / "looped_paper_optima_coefficients.csv").set_index("coefficient")
    assert list(coef.index) == ["A", "alpha", "B", "beta", "E", "phi"] and coef.loc["E", "paper"] == 1.56773
    assert coef.loc["phi", "within"] and not coef.loc[["E", "alpha", "beta"], "within"].any()
    assert coef.loc["E", "ours"] == pytest.approx(ours.E, rel=1e-3)
    words = coef.verdict.iloc[0]
    assert words.startswith("phi reproduced") and "outside their tolerance of Table 2: A, alpha, B, beta, E" in words
    assert "phi reproduced" in v.loc["phi refitted on the paper's 24 per-(C, r) optima", "note"]
    assert (v.filter(like="Fig. 3 exponent", axis=0).verdict == "reproduced").sum() == 8


def test_case_study_frame_keeps_the_four_lowest_budgets():
    "A TBPTT run above the grid's four lowest budgets does not enter Table 3's fit (the paper has none there)."
    grid, tb = scaling.paper_grid_frame(), scaling.paper_grid_frame("tbptt")
    above = tb[tb.r > 1].iloc[:1].assign(C=1e19)
    lf = pd.concat([grid, tb[tb.r > 1], above]).assign(loss=2.5, lr=0.014)
    cs = report_looped._case_study_frame(lf, "tbptt")
    assert set(cs.C) == set(CASE_STUDY_BUDGETS) and len(cs) == 89 and (cs.r == 1).sum() == 20


def flagship(study: str, r: int):
    return make_run_config("looped", preset="looped-flagship", r=r, s=34, study=study, verbose=False)


def downstream_record(run, losses: dict, missing=("drop", "coqa")):
    "A downstream.json as `depthbench-nb downstream` writes it: per group its loss, accuracy, tasks and missing tasks."
    groups = {
        g: dict(
            loss=v, accuracy=0.5, n_tasks=1, tasks=["t"], missing=[m for m in missing if g == "reading_comprehension"]
        )
        for g, v in losses.items()
    }
    folder = run_dir(run) / "downstream"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "downstream.json").write_text(
        json.dumps(dict(groups=groups, missing={m: "data file x is not there" for m in missing}, tasks={}, limit=None))
    )


def test_table10_and_the_downstream_results(tmp_path, monkeypatch):
    """Table 10 compares the runs of its plan (s = 34, 89,645 steps x 524,288 tokens, r = 1 and 4: the study
    looped-extrapolation, whose `sweep plan` shows the cost), never the grid's s = 34 runs at 2.15e19 FLOPs; the
    downstream results per r at matched budgets, a figure by task group, and the absent tasks named in the index."""
    monkeypatch.setenv("DEPTHBENCH_RUNS", str(tmp_path / "runs"))
    plan = plan_rows(expand_study(load_study("looped-extrapolation")))
    assert [(p["r"], p["s"], p["steps"], p["tokens"]) for p in plan] == [
        (r, 34, 89_645, 89_645 * 524_288) for r in (1, 4)
    ]
    assert all(3.8e20 < p["train_flops"] < 4.1e20 for p in plan) and all(p["gpu_hours"] > 100 for p in plan)
    assert {e.run_id for e in expand_study(load_study("looped-extrapolation"))} == {
        flagship("looped-extrapolation", r).run_id for r in (1, 4)
    }
    grid = {
        (row["r"], row["s"], row["C"]): grid_run("looped-main", row)
        for row in looped_grid_rows("baseline")
        if row["s"] in (10, 12, 34) and row["r"] in (1, 4)
    }
    for (r, s, C), run in grid.items():
        write_looped_record(run, 2.3 + 0.01 * r + (0.02 if s == 12 else 0.0) + (0.5 if C < 2e19 else 0.0))
    lf = report_looped._looped_frame(report_common.study_table("looped-main"))
    before = report_common.Report("looped-main", "looped", report_common.Scale((), True, "runs"), tmp_path / "before")
    report_looped._looped_extrapolation_section(before, lf, report_common.reference_table("looped"), {})
    assert (
        set(lf[lf.s == 34].paper_item) == {"grid"} and not before.built()
    )  # the grid's s = 34 runs are not Table 10's
    assert "sweep run looped-extrapolation" in dict(before.missing)["extrapolation comparison (Table 10)"]
    for r, loss in ((1, 2.05), (4, 2.11)):
        write_looped_record(flagship("looped-extrapolation", r), loss)
    paper_like = dict(
        parametric_knowledge=2.6,
        reading_comprehension=1.0,
        math=1.5,
        reasoning_primitives=0.9,
        compositional_symbolic=1.5,
    )
    downstream_record(flagship("looped-extrapolation", 1), paper_like)
    downstream_record(flagship("looped-extrapolation", 4), {g: v + 0.1 for g, v in paper_like.items()})
    for (r, s, C), run in grid.items():
        if C == 1e18:
            downstream_record(run, {g: v + 0.2 * (r == 4) + 0.05 * (s == 12) for g, v in paper_like.items()})
    rep = report_looped.build_looped_report("looped-main", out_dir=tmp_path / "after", restarts=2, n_bootstrap=0)
    t10 = pd.read_csv(tmp_path / "after" / "looped_table10_extrapolation.csv").set_index("metric")
    assert t10.loc["validation loss", ["r1", "r4", "paper_r1", "paper_r4"]].tolist() == pytest.approx(
        [2.05, 2.11, 2.047, 2.108]
    )
    assert (
        t10.loc["validation loss", "gap"] == pytest.approx(0.06)
        and t10.loc["validation loss", "runs"] == "r = 1: paper scale; r = 4: paper scale"
    )
    assert t10.loc["parametric knowledge", ["r1", "r4", "paper_r1", "paper_r4"]].tolist() == pytest.approx(
        [2.6, 2.7, 2.585, 2.693]
    )
    assert t10.loc["compositional symbolic", "paper_gap"] == pytest.approx(-0.004)
    m = pd.read_csv(tmp_path / "after" / "looped_downstream_matched.csv")
    at = m[(m.budget == "C = 1e+18") & (m.group == "math")].iloc[
        0
    ]  # the better (lower val loss) width of each r: s = 10
    assert (at.loss_r1, at.loss_r4, at.gap_r4) == pytest.approx(
        (1.5, 1.7, 0.2)
    ) and at.widths == "r = 1: s = 10, r = 4: s = 10"
    top = m[m.budget.str.startswith("Table 10") & (m.group == "reading_comprehension")].iloc[0]
    assert (top.gap_r4, top.paper_r1, top.paper_r4) == pytest.approx((0.1, 0.980, 1.030))
    assert {"looped_downstream", "looped_downstream_matched", "looped_table10_extrapolation"} <= rep.built()
    index = pd.read_csv(tmp_path / "after" / "looped_paper_index.csv").set_index("paper")
    assert (
        index.loc["downstream results", "status"] == "partial"
        and "tasks not evaluated (data not present): coqa, drop" in index.loc["downstream results", "detail"]
    )
    assert (
        index.loc["Table 10", "status"] == "rebuilt with a stated difference"
        and "FP8" in index.loc["Table 10", "detail"]
    )
    assert "downstream tasks coqa, drop" in (tmp_path / "after" / "looped_index.md").read_text()


def test_a_plugin_family_lands_in_the_report_of_its_recipe(tmp_path, monkeypatch):
    """Which runs and designs a report reads is asked of the registry (`Family.shared_recipe`), never of a family's
    name: a plugin's family on the looped paper's own recipe lands in the looped report, one on DepthBench's recipe in
    DepthBench's report (its designs and cost rows), and a record of a design no longer registered stays there."""
    monkeypatch.setenv("DEPTHBENCH_RUNS", str(tmp_path / "runs"))
    register_family(Family("plugin_loops", "a plugin's loop, trained with its paper's own recipe", shared_recipe=False))
    register_family(Family("plugin_streams", "a plugin's residual stream, on DepthBench's recipe"))
    twins = dict(plugin_loop=("looped", "plugin_loops"), plugin_res=("preln", "plugin_streams"))
    for name, (base, family) in twins.items():  # twins of shipped designs (without a second 'looped' grid)
        register_design(dataclasses.replace(ARCHS[base], name=name, family=family, paper=None, aliases=(), grids={}))
    try:
        assert recipe_designs(shared=False) == ["looped", "plugin_loop"]
        assert recipe_designs()[-1] == "plugin_res" and "plugin_loop" not in recipe_designs()
        costed = report_depthbench._costed_designs()
        assert "plugin_res" in costed and "plugin_loop" not in costed and "looped" not in costed
        for arch in ("looped", "plugin_loop"):  # the looped recipe's run builder makes the plugin's own run
            run = make_run_config(arch, preset="looped", r=4, s=2, C=1e18, study="plugins", verbose=False)
            assert run.model.arch == arch
            write_looped_record(run, 3.0)
        shared_run = make_run_config("plugin_res", L=2, d_model=32, preset="tiny", study="plugins", verbose=False)
        write_looped_record(shared_run, 4.0)  # the same record layout
        df = report_common.study_table("plugins")
        assert sorted(df.arch) == ["looped", "plugin_loop", "plugin_res"]
        assert sorted(report_looped._looped_frame(df).run_id) == sorted(df.run_id[df.arch != "plugin_res"])
        assert list(df[report_common.recipe_runs(df)].arch) == ["plugin_res"]
        unregister_design("plugin_res")  # its record stays with DepthBench's report, as a record of a removed design
        assert list(df[report_common.recipe_runs(df)].arch) == ["plugin_res"]
        assert sorted(df[report_common.recipe_runs(df, shared=False)].arch) == ["looped", "plugin_loop"]
    finally:
        for name in twins:
            if dict.__contains__(ARCHS, name):
                unregister_design(name)
        for family in ("plugin_loops", "plugin_streams"):
            FAMILIES.pop(family)


def test_table5_is_the_papers_cell_only(tmp_path):
    """Table 5 sets the paper's losses beside the runs of its one cell (s = 10, r = 4, C = 1e18) only; the injections'
    runs of other cells go to a table of their own, with no paper number."""
    rows = [
        dict(injection=i, r=r, s=s, C=C, D=1e9, loss=loss, scale="paper scale")
        for i, r, s, C, loss in (
            ("linear", 4, 10, 1e18, 2.80),
            ("additive", 4, 10, 1e18, 2.81),
            ("hc", 4, 10, 1e18, 2.76),
            ("linear", 8, 16, 1e19, 2.61),  # another cell: never beside the paper's 2.793
            ("additive", 8, 16, 1e19, 2.62),
        )
    ]
    rep = report_common.Report("t", "looped", report_common.Scale((), True, "runs"), tmp_path)
    report_looped._looped_table5_section(rep, pd.DataFrame(rows), report_common.reference_table("looped"))
    t5 = pd.read_csv(tmp_path / "looped_table5_injection.csv")
    other = pd.read_csv(tmp_path / "looped_table5_other_cells.csv")
    assert set(t5.s) == {10} and set(t5.r) == {4} and np.allclose(t5.C, 1e18)
    assert t5.set_index("injection").paper_val_loss.to_dict() == {"additive": 2.797, "hc": 2.757, "linear": 2.793}
    assert set(other.s) == {16} and not any("paper" in c for c in other.columns)
    assert rep.gaps["Table 5"] == ["injections without runs at s = 10, r = 4, C = 1e18: passthrough"]
    # no run at the paper's cell: Table 5 is missing and says where the other cells' runs are
    rep2 = report_common.Report("t", "looped", report_common.Scale((), True, "runs"), tmp_path / "b")
    report_looped._looped_table5_section(rep2, pd.DataFrame(rows[3:]), report_common.reference_table("looped"))
    assert "looped_table5_injection" not in rep2.built() and "no run at the paper's cell" in rep2.missing[0][1]


def test_width_result_on_the_papers_coefficients():
    """On the paper's own Table 2 coefficients (A, B: the project page) every looped r's compute-optimal model is wider
    than r = 1's at every grid budget, with fewer unique parameters (§4.2); with the same coefficients a lower phi
    (truncated BPTT's 0.38) moves the optimum wider and a higher one (hyperconnections' 0.646) narrower (App. G.3)."""
    budgets = [4.64e17, 1e18, 2.15e18, 4.64e18, 1e19, 2.15e19]
    paper = dict(scaling.PAPER_LOOPED)
    laws = {
        "paper": (scaling.law_from_params(**paper), "baseline", None),
        "low phi": (scaling.law_from_params(**dict(paper, phi=0.38)), "baseline", "paper"),
        "high phi": (scaling.law_from_params(**dict(paper, phi=0.646)), "baseline", "paper"),
    }
    t = report_looped.looped_width(laws, budgets)
    v = report_looped._width_verdicts(t, {"paper": laws["paper"]}, {"paper": dict(scale_free=True)})
    assert v.verdict.tolist() == ["reproduced"] and v.cells[0] == "18 of 18 (r > 1, budget) cells wider"
    p = t[t.law == "paper"]
    # independent check of one optimum: a grid over widths at C = 1e19, r = 4 (the law and the §3.2 accounting)
    acc = [scaling.paper_accounting(d, 4) for d in np.geomspace(256, 8192, 4000)]
    law = laws["paper"][0]
    loss = [float(law.predict(law.n_eff(a.n_once, a.n_rec, 4), 1e19 / a.flops_per_token)) for a in acc]
    d_grid = acc[int(np.argmin(loss))].d
    d_opt = p[(p.r == 4) & np.isclose(p.C, 1e19)].d.iloc[0]
    assert d_opt == pytest.approx(d_grid, rel=0.01)
    assert (p[p.r > 1].d_vs_r1 > 1).all() and (p[p.r > 1].N_vs_r1 < 1).all()
    looped = t[t.r > 1]
    assert (looped[looped.law == "low phi"].d_vs_baseline > 1).all()
    assert (looped[looped.law == "high phi"].d_vs_baseline < 1).all()
    # truncated BPTT's accounting: Eq. 6 (23-26% fewer training FLOPs per token at r = 2..8, s = 10)
    from depthbench_nb.looped import flops_per_token

    for r in (2, 4, 8):
        ours = report_looped._variant_accounting("tbptt")(640.0, r).flops_per_token
        assert ours == pytest.approx(flops_per_token(10, r, truncated_bptt=True), rel=0.01)
