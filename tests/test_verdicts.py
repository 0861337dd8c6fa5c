"""One verdict rule for both reports: a claim says `reproduced` / `NOT reproduced` only when its runs are at
the paper's setting (or it is scale-free), every fit it rests on is identified and its measurement is valid; otherwise
the verdict names the condition that fails (`not comparable`, `not identified`, `not measured`, `not checkable`).

The looped report is built here from run records written at the paper's setting (the `looped` preset's exact shapes,
budgets and steps: tests/looped_records.py), their losses from the paper's law with phi = 0.459 and, for the
edge-pinned case, phi = 3.5 (beyond the search box: the fit puts phi on its edge).
"""

import numpy as np
import pandas as pd
import pytest

from depthbench_nb import report_common, report_looped, scaling
from depthbench_nb.looped import looped_grid_rows, looped_params
from depthbench_nb.report_common import (
    Claim,
    Evidence,
    Report,
    RunScale,
    Scale,
    VERDICT_GUIDE,
    claim_verdict,
    claims_table,
    verdict_word,
)
from depthbench_nb.run_params import make_run_config
from looped_records import write_looped_record

LAW = dict(E=1.56773, A=28.027, B=915.82, alpha=0.19924, beta=0.36863)  # the project page's fit
RESTARTS = 8
CITABLE = ("reproduced", "NOT reproduced")


def _records(root, phi: float, seed: int = 0):
    "looped-main's 116 grid runs at the paper's setting, each loss from the law with `phi` plus 0.003 nats of noise."
    rng = np.random.default_rng(seed)
    for row in looped_grid_rows("baseline"):
        run = make_run_config(
            "looped", preset="looped", r=row["r"], s=row["s"], C=row["C"], study="looped-main", verbose=False
        )
        p = looped_params(run.model)
        n_eff = p.n_once + run.model.recurrence**phi * p.n_rec
        loss = LAW["E"] + LAW["A"] * n_eff ** -LAW["alpha"] + LAW["B"] * run.train.tokens ** -LAW["beta"]
        write_looped_record(run, float(loss + 0.003 * rng.standard_normal()))


def _report(tmp_path_factory, monkeypatch_module, phi: float, restarts: int = RESTARTS):
    root = tmp_path_factory.mktemp(f"runs-phi{phi}")
    monkeypatch_module.setenv("DEPTHBENCH_RUNS", str(root))
    _records(root, phi)
    out = root / "report"
    rep = report_looped.build_looped_report("looped-main", out_dir=out, restarts=restarts, n_bootstrap=0, related=[])
    return rep, pd.read_csv(out / "looped_claims.csv").set_index("claim")


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def paper_law(tmp_path_factory, monkeypatch_module):
    "The report on 116 runs at the paper's setting whose losses follow the paper's law (phi = 0.459)."
    return _report(tmp_path_factory, monkeypatch_module, 0.459)


@pytest.fixture(scope="module")
def pinned(tmp_path_factory, monkeypatch_module):
    "The same grid with losses from phi = 3.5: the fit puts phi on the search box's edge (it identifies nothing)."
    return _report(tmp_path_factory, monkeypatch_module, 3.5, restarts=4)


def _verdict(claims: pd.DataFrame, like: str) -> str:
    return claims.filter(like=like, axis=0).verdict.iloc[0]


def _rebuilt_claims(rep: Report, tmp_path, stem: str, edit) -> pd.DataFrame:
    "The report's claims after `edit` changed one of its tables (copied, so the module's report is left as built)."
    out = tmp_path / "report"
    out.mkdir()
    for name, _ in rep.artifacts:
        src = rep.out_dir / name
        if src.suffix == ".csv":
            (out / name).write_text(src.read_text())
    edit(out / f"{stem}.csv")
    copy = Report(rep.study, rep.name, rep.scale, out, artifacts=list(rep.artifacts))
    return claims_table(copy, report_looped._LOOPED_CLAIMS).set_index("claim")


def _set(path, **cols):
    t = pd.read_csv(path)
    for k, v in cols.items():
        t[k] = v(t) if callable(v) else v
    t.to_csv(path, index=False)


# --- identified and comparable: reproduced and NOT reproduced, both ways ---------------------------------------------


def test_identified_runs_at_the_papers_setting_get_a_citable_verdict(paper_law):
    rep, claims = paper_law
    assert rep.scale.comparable and rep.scale.n_comparable == 116
    t2 = pd.read_csv(rep.out_dir / "looped_table2_joint.csv").set_index("fit")
    assert t2.loc["phi_free", "identified"] and abs(t2.loc["phi_free", "phi"] - 0.459) < 0.05
    assert _verdict(claims, "phi = 0.46") == "reproduced"
    assert _verdict(claims, "0 < phi < 1") == "reproduced"  # the profile rejects phi = 0 and phi = 1
    assert _verdict(claims, "the frontier gap to r = 1 grows with r") == "reproduced"
    assert _verdict(claims, "the law fitted here") == "reproduced"
    assert _verdict(claims, "per-r Chinchilla laws") in CITABLE


def test_the_same_runs_can_say_not_reproduced(paper_law, tmp_path):
    "The check can fail: the joint law's phi moved out of the paper's CI, and a phi = 0 fit as good as the free one."
    rep, _ = paper_law
    moved = _rebuilt_claims(rep, tmp_path, "looped_table2_joint", lambda p: _set(p, phi=lambda t: t.phi + 0.3))
    assert _verdict(moved, "phi = 0.46") == "NOT reproduced"
    tmp2 = tmp_path / "b"
    tmp2.mkdir()
    flat = _rebuilt_claims(
        rep, tmp2, "looped_table2_joint", lambda p: _set(p, huber=lambda t: t.huber.where(t.fit != "phi_0", t.huber[0]))
    )
    assert _verdict(flat, "0 < phi < 1") == "NOT reproduced"  # nested R² could never say this


# --- edge-pinned: not identified --------------------------------------------------------------------------------------


def test_a_fit_on_the_box_edge_is_not_identified(pinned):
    rep, claims = pinned
    t2 = pd.read_csv(rep.out_dir / "looped_table2_joint.csv").set_index("fit")
    assert not t2.loc["phi_free", "identified"] and "phi" in t2.loc["phi_free", "at_bounds"]
    assert rep.scale.comparable  # at the paper's setting: only identification fails
    for like in ("phi = 0.46", "0 < phi < 1", "the law fitted here"):
        assert _verdict(claims, like).startswith("not identified: "), like
    st = pd.read_csv(rep.out_dir / "looped_stability.csv")
    if not st.identified.all():  # a refit on the box's edge
        assert _verdict(claims, "phi is stable").startswith("not identified")
    assert "found" in claims and claims.filter(like="phi = 0.46", axis=0).found.iloc[0].startswith("phi = ")


def test_compute_optima_on_the_width_ranges_edge_are_not_identified(paper_law, tmp_path):
    rep, _ = paper_law
    edged = _rebuilt_claims(rep, tmp_path, "looped_frontier", lambda p: _set(p, at_bound=True))
    verdict = _verdict(edged, "the frontier gap to r = 1 grows with r")
    assert verdict.startswith("not identified: the frontier's compute-optimal widths: 48 of 48 lie on the edge")
    law = scaling.law_from_params(**dict(scaling.PAPER_LOOPED, phi=-0.82))
    laws = {"fitted": (law, "baseline", None)}
    t = report_looped.looped_width(laws, [1e18, 1e19]).assign(at_bound=True)
    v = report_looped._width_verdicts(t, laws, {"fitted": dict(not_comparable="", not_identified="")})
    assert v.verdict[0].startswith("not identified: fitted: the optima: 8 of 8")


def test_a_phi_inside_the_papers_ci_with_an_interval_wider_than_itself_is_not_identified():
    "The 24 published optima: phi 0.439 lands in the paper's CI, its interval [-2.36, 0.49] pins nothing."
    fit = scaling.law_from_params(A=20.0, alpha=0.14, B=500.0, beta=0.223, E=1.049, phi=0.439)
    t = report_looped._paper_optima_coefficients(fit, dict(phi=[-2.36, 0.49]))
    words = report_looped._optima_verdict(t, fit)
    assert words.startswith("phi not identified: phi's interval [-2.36, 0.49]") and "reproduced" not in words
    ok = report_looped._paper_optima_coefficients(fit, dict(phi=[0.41, 0.47]))
    assert report_looped._optima_verdict(ok, fit).startswith("phi reproduced")


# --- tiny: not comparable ---------------------------------------------------------------------------------------------


def test_runs_not_at_the_papers_setting_are_not_comparable(paper_law, tmp_path):
    rep, _ = paper_law
    tiny = "reduced scale: 116 of 116 runs are not paper scale (e.g. 40 steps completed (the paper: 3,677))"
    claims = _rebuilt_claims(rep, tmp_path, "looped_table2_joint", lambda p: _set(p, scale=tiny))
    assert _verdict(claims, "phi = 0.46").startswith("not comparable: reduced scale")
    assert claims.filter(like="phi = 0.46", axis=0).found.iloc[0].startswith("phi = 0.4")  # what was computed stays
    # a check that gives a bare verdict word is judged by the report's scale
    demo = Report("demo", "looped", RunScale(("tiny",), False, "demo", 28, 0), tmp_path / "demo")
    demo.table(pd.DataFrame(dict(x=[1.0])), "t", "a table")
    claim = Claim("x = 1", "a paper v1", "t", "exact", lambda t: ("1", verdict_word(True)))
    free = Claim("closed form", "a paper v1", "t", "exact", lambda t: ("1", verdict_word(True)), scale_free=True)
    t = claims_table(demo, [claim, free])
    assert t.verdict[0] == "not comparable: 28 of 28 runs not at the paper's setting (presets tiny; provenance demo)"
    assert t.verdict[1] == "reproduced"  # scale-free: accounting still gets a verdict


def test_the_demo_records_give_no_citable_verdict_but_scale_free_ones(tmp_path, monkeypatch):
    "Acceptance: on the demo's tiny runs only the worked example and the paper's own coefficients are judged."
    from pathlib import Path

    monkeypatch.setenv("DEPTHBENCH_RUNS", str(Path(__file__).parents[1] / "docs" / "example_study"))
    report_looped.build_looped_report("demo", out_dir=tmp_path, restarts=2, n_bootstrap=0)
    claims = pd.read_csv(tmp_path / "looped_claims.csv")
    citable = claims[claims.verdict.isin(CITABLE)]
    assert set(citable.scale) == {"any scale"} and len(citable) == 2
    assert claims[claims.scale != "any scale"].verdict.str.match("not (comparable|built|identified|checkable)").all()
    assert (tmp_path / "looped_claims.md").read_text().splitlines()[2].startswith("How to read a verdict")
    assert "[`looped_claims.md`](looped_claims.md)" in (tmp_path / "looped_index.md").read_text()


# --- unmeasured: not measured; the rule itself ------------------------------------------------------------------------


def test_a_measurement_not_valid_for_the_claim_is_not_measured(tmp_path):
    rep = Report("s", "depthbench", Scale(("400m",), True, "runs"), tmp_path)
    rep.table(pd.DataFrame(dict(arch=["hc"], s_per_token=[1e-4])), "costs", "costs")
    cpu = "CPU seconds per token; the paper timed A100 GPUs"
    claim = Claim(
        "HC takes the most GPU-hours",
        "a paper v1",
        "costs",
        "first",
        lambda t: ("hc", Evidence(True, not_measured=cpu)),
    )
    t = claims_table(rep, [claim])
    assert t.verdict[0] == f"not measured: {cpu}" and t.found[0] == "hc"


@pytest.mark.parametrize(
    "ev, want",
    [
        (Evidence(True, not_comparable=""), "reproduced"),
        (Evidence(False, not_comparable=""), "NOT reproduced"),
        (Evidence(True, scale_free=True), "reproduced"),
        (Evidence(True, not_comparable="tiny"), "not comparable: tiny"),
        (Evidence(False, not_comparable="", not_identified="phi at the edge"), "not identified: phi at the edge"),
        (Evidence(True, not_comparable="", not_measured="CPU"), "not measured: CPU"),
        (Evidence(None, not_comparable="", not_checkable="one depth"), "not checkable: one depth"),
        (Evidence(True), "not comparable: the runs were not judged against the paper setting"),
        (Evidence(True, scale_free=True, not_identified="the refit"), "not identified: the refit"),
    ],
)
def test_the_rule_on_each_branch(ev, want):
    assert claim_verdict(ev) == want


def test_every_looped_claim_names_the_version_it_quotes():
    sources = [c.source for c in report_looped._LOOPED_CLAIMS]
    assert all("2604.21106v" in s for s in sources)
    down = next(c for c in report_looped._LOOPED_CLAIMS if c.claim.startswith("downstream"))
    assert "v1 and v2 abstract" in down.source and "v3" in down.source
    assert VERDICT_GUIDE.startswith("How to read a verdict") and "not identified" in VERDICT_GUIDE


def test_the_width_row_says_what_the_law_implies_and_the_unique_parameters(tmp_path):
    rep = Report("w", "looped", RunScale((), False, "runs"), tmp_path)
    report_looped._looped_width_section(rep)
    v = pd.read_csv(tmp_path / "looped_width_verdicts.csv").iloc[0]
    assert v.verdict == "reproduced" and v.unique_params == "N*(r) / N*(1) from 38% to 66%"
    limit = float(v.holds_for.split("below ")[1].split(" ")[0])
    assert 0.8 < limit < 0.95  # the algebra holds well past the paper's phi: it does not test the data
    law = scaling.law_from_params(**dict(scaling.PAPER_LOOPED, phi=limit + 0.02))
    t = report_looped.looped_width({"x": (law, "baseline", None)}, report_looped._PAPER_BUDGETS)
    assert (t[t.r > 1].d_vs_r1 < 1).any()  # just past the limit some looped r is narrower
    assert report_common.claim_verdict(Evidence(True, scale_free=True)) == v.verdict
