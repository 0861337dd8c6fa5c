"""Scaling-law fitter: objective, published Chinchilla replication, synthetic phi recovery with block-bootstrap
coverage, warm starts, the batched method against the paper's scipy loop, compute-optimal widths, CLI and bad input."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from depthbench_nb.cli import main
from depthbench_nb.config import ConfigError
from depthbench_nb import scaling
from depthbench_nb.scaling import (
    _LOWER,
    PAPER_LOOPED,
    _SCIPY_OPTIONS,
    _UPPER,
    FitResult,
    block_bootstrap,
    _chinchilla_data,
    empirical_optima,
    _fit_chinchilla,
    fit_frame,
    _fit_per_r,
    law_data_from_frame,
    _law_objective,
    law_optimum,
    _looped_data,
    minimise_law,
    naive_objective,
    paper_accounting,
    paper_grid_frame,
    _single_objective,
    synthetic_looped_frame,
    _theta_from_params,
    worked_example,
)

DATA = Path(__file__).parent / "data" / "chinchilla_fig4_epoch.csv"
# Besiroglu et al. 2024 (arXiv:2404.10102), Epoch's refit of Hoffmann et al. Fig. 4: estimate, standard error
BESIROGLU = dict(E=(1.8172, 0.03), A=(482.01, 124.58), B=(2085.43, 1293.23), alpha=(0.3478, 0.02), beta=(0.3658, 0.02))


def chinchilla_frame():
    raw = pd.read_csv(DATA)
    df = pd.DataFrame(dict(N=raw["Model Size"], D=raw["Training FLOP"] / (6 * raw["Model Size"]), loss=raw["loss"]))
    return df.sort_values("loss").iloc[:-5]  # Epoch excluded the 5 highest-loss points


@pytest.fixture(scope="module")
def synthetic():
    return synthetic_looped_frame(noise=0.005, seed=3)


@pytest.fixture(scope="module")
def synthetic_fit(synthetic):
    return fit_frame(synthetic, "looped", restarts=30, seed=0)


def test_objective_matches_naive_and_numeric_gradient():
    rng = np.random.default_rng(1)
    n = 20
    data = _looped_data(
        n_once=rng.uniform(1e7, 1e8, n) * (rng.random(n) > 0.3),
        n_rec=rng.uniform(1e7, 1e8, n),
        r=rng.choice([1, 2, 4, 8], n),
        D=rng.uniform(1e8, 1e10, n),
        loss=rng.uniform(2.3, 3.3, n),
    )
    theta = _LOWER + (_UPPER - _LOWER) * rng.random((8, 6))
    J, G = _law_objective(theta, data)
    assert np.allclose(J, [naive_objective(t, data) for t in theta], rtol=1e-12, atol=0)
    eps = 1e-6
    for t, g in zip(theta, G):
        num = [(naive_objective(t + eps * e, data) - naive_objective(t - eps * e, data)) / (2 * eps) for e in np.eye(6)]
        assert np.allclose(g, num, rtol=1e-5, atol=1e-9)
    # the optimiser's lean single-θ path: same J and gradient (φ free, or fixed and dropped)
    for t, j, g in zip(theta, J, G):
        Js, gs = _single_objective(data)(t)
        assert np.isclose(Js, j, rtol=1e-12) and np.allclose(gs, g, rtol=1e-10, atol=1e-14)
        t1 = t.copy()
        t1[5] = 1.0
        Js, gs = _single_objective(data, phi=1.0)(t1[:5])
        assert np.isclose(Js, naive_objective(t1, data), rtol=1e-12) and np.allclose(
            gs, _law_objective(t1, data)[1][0, :5], rtol=1e-10, atol=1e-14
        )


def test_chinchilla_replication_matches_besiroglu():
    df = chinchilla_frame()
    fit = _fit_chinchilla(df.N, df.D, df.loss, restarts=500, seed=0)
    assert fit.n_points == 240 and fit.provenance == "real" and fit.law == "chinchilla" and fit.phi is None
    # within a fraction of the published standard errors (A, B are loosely identified: SE 26 % and 62 %)
    for name, (est, se) in BESIROGLU.items():
        assert abs(getattr(fit, name) - est) < 0.5 * se, (name, getattr(fit, name), est)
    assert abs(fit.E - 1.8172) < 0.005 and abs(fit.alpha - 0.3478) < 0.005 and abs(fit.beta - 0.3658) < 0.005
    assert fit.n_at_best >= 10  # many starts agree on the optimum
    # the optimum is a true minimum: no random point of the box nor the published point does better
    data = _chinchilla_data(df.N, df.D, df.loss)
    published = _theta_from_params(**{k: v[0] for k, v in BESIROGLU.items()})
    assert fit.huber <= naive_objective(published, data) + 1e-12
    assert abs(fit.huber - naive_objective(np.array(fit.theta), data)) < 1e-15


def test_tight_tolerances_beat_scipy_defaults():
    """arXiv 2604.21106 §4.2, App. F (docs/scaling_fit.md):
    the default L-BFGS-B tolerances stop early on this objective; the tight ones reach a lower J."""
    from scipy.optimize import minimize

    df = chinchilla_frame()
    data = _chinchilla_data(df.N, df.D, df.loss)
    tight = minimise_law(data, restarts=10, seed=0, method="scipy")
    lo, hi = _LOWER[:5], _UPPER[:5]
    rng = np.random.default_rng(0)
    loose = min(
        minimize(
            lambda x: _law_objective(np.r_[x, 0.0], data)[0][0],
            lo + (hi - lo) * rng.random(5),
            method="L-BFGS-B",
            bounds=list(zip(lo, hi)),
        ).fun
        for _ in range(10)
    )
    assert tight.J < loose and _SCIPY_OPTIONS["ftol"] <= 1e-15


def test_synthetic_recovery_of_phi(synthetic, synthetic_fit):
    fit = synthetic_fit
    assert fit.provenance == "synthetic" and fit.n_points == 116
    assert abs(fit.phi - PAPER_LOOPED["phi"]) < 0.03 and abs(fit.beta - PAPER_LOOPED["beta"]) < 0.03
    assert fit.r2 > 0.995 and fit.at_bounds == []
    # data from a law outside the box (phi = 3.5 > 3): the fit says phi sits on the box's edge
    outside = synthetic_looped_frame(dict(PAPER_LOOPED, phi=3.5), noise=0.0, seed=0)
    edge = fit_frame(outside, "looped", restarts=5, seed=0)
    assert edge.phi == pytest.approx(3.0) and "phi" in edge.at_bounds
    # the fit is at least as good as the truth it was generated from
    truth = _theta_from_params(**PAPER_LOOPED)
    assert fit.huber <= naive_objective(truth, law_data_from_frame(synthetic, "looped")) + 1e-12
    # residual table per r: 4 r values and the pooled row, RMSE near the noise level
    rows = {row["r"]: row for row in fit.residuals}
    assert set(rows) == {1, 2, 4, 8, "all"} and all(rows[r]["n"] == 29 for r in (1, 2, 4, 8))
    assert 0.003 < rows["all"]["rmse"] < 0.008
    # restricted laws (phi fixed at 0 or 1) fit worse than the free law
    for phi in (0.0, 1.0):
        restricted = fit_frame(synthetic, "looped", phi=phi, restarts=10, seed=0)
        assert (
            restricted.phi == phi and restricted.phi_fixed and restricted.huber > fit.huber and restricted.r2 < fit.r2
        )


def test_bootstrap_ci_covers_truth(synthetic, synthetic_fit):
    boot = block_bootstrap(
        synthetic,
        "looped",
        block_cols=("C", "r"),
        n_resamples=24,
        restarts=4,
        seed=0,
        warm_start=synthetic_fit,
        workers=1,
    )
    assert boot["n_blocks"] == 24 and len(boot["samples"]) == 24 and boot["restarts"] == 4 and boot["warm_start"]
    lo, hi = boot["ci"]["phi"]
    assert lo <= PAPER_LOOPED["phi"] <= hi and hi - lo < 0.2
    assert set(boot["ci"]) == {"E", "A", "B", "alpha", "beta", "phi"}
    # the warm-start count is what the samples say, and every refit's best was reached by some start
    assert boot["best_from_warm_start"] == boot["samples"]["best_from_warm_start"].sum()
    assert (boot["samples"]["n_at_best"] >= 1).all()
    # same seed, same resamples: the bootstrap is reproducible, and worker processes change nothing
    again = block_bootstrap(
        synthetic, "looped", n_resamples=10, restarts=4, seed=0, warm_start=synthetic_fit, workers=1
    )
    assert np.allclose(again["samples"]["phi"], boot["samples"]["phi"][:10])
    parallel = block_bootstrap(
        synthetic, "looped", n_resamples=10, restarts=4, seed=0, warm_start=synthetic_fit, workers=2
    )
    assert np.array_equal(parallel["samples"]["phi"], again["samples"]["phi"])
    assert np.array_equal(parallel["samples"]["huber"], again["samples"]["huber"])


def check_against_scipy(synthetic, n_resamples: int):
    """The acceptance check (the benchmark runs all 200 resamples):
    J <= scipy's best of 500 x (1 + 1e-12), phi within 1e-4."""
    data = law_data_from_frame(synthetic, "looped")
    full = fit_frame(synthetic, "looped", restarts=500, seed=0)
    ref = minimise_law(data, restarts=500, seed=0, method="scipy")
    assert full.huber <= ref.J * (1 + 1e-12) and abs(full.phi - ref.theta[5]) < 1e-4
    blocks = scaling.table_blocks(synthetic, ("C", "r"))
    boot = scaling.law_bootstrap(
        data, blocks, n_resamples=n_resamples, restarts=500, seed=5, warm_start=full, workers=1
    )
    weights = resample_weights(data, blocks, n_resamples, 5)
    for i, row in boot.iterrows():
        rdata = scaling._repeat_runs(data, weights[i])
        sc = minimise_law(rdata, restarts=500, seed=int(row.seed), extra_starts=[full.theta], method="scipy")
        ours = np.array([np.log(row.A), row.alpha, np.log(row.B), row.beta, np.log(row.E), row.phi])
        assert naive_objective(ours, rdata) <= naive_objective(sc.theta, rdata) * (1 + 1e-12)
        assert abs(row.phi - sc.theta[5]) < 1e-4
        assert row.n_at_best >= 50  # on this grid most random starts reach the best basin


def test_batched_fit_matches_scipy_loop(synthetic):
    "The full fit and one bootstrap resample at the paper's effort, against the scipy loop (about 10 s)."
    check_against_scipy(synthetic, 1)


@pytest.mark.paper_effort
def test_batched_fit_matches_scipy_loop_on_five_resamples(synthetic):
    "Five resamples (about 30 s; deselected by scripts/test.sh, run with `pytest -m paper_effort`)."
    check_against_scipy(synthetic, 5)


def resample_weights(data, blocks, n, seed):
    "law_bootstrap's resamples, drawn independently here: each block's runs weighted by how often it was drawn."
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        w = np.zeros(data.n)
        for j in rng.integers(0, len(blocks), len(blocks)):
            w[blocks[j]] += 1
        out.append(w)
    return out


def test_batched_kernel_weights_are_multiplicities(synthetic):
    "A resample as weights gives the objective of its runs concatenated (the scipy loop's view of a resample)."
    data = law_data_from_frame(synthetic, "looped")
    w = np.random.default_rng(2).integers(0, 4, data.n).astype(float)
    rows = scaling._objective_rows(data, w)
    theta = _LOWER + (_UPPER - _LOWER) * np.random.default_rng(3).random((5, 6))
    J, g, _ = scaling._batch_objective(theta, {k: np.repeat(v[None], 5, 0) for k, v in rows.items()}, True, "g")
    J2, g2 = _law_objective(theta, scaling._repeat_runs(data, w))
    assert np.allclose(J, J2, rtol=1e-12) and np.allclose(g, g2, rtol=1e-10, atol=1e-15)


def test_bootstrap_of_one_block_is_a_clear_error(synthetic):
    with pytest.raises(ConfigError, match="at least 2 blocks"):
        block_bootstrap(synthetic[synthetic.r == 1], "looped", block_cols=("r",), n_resamples=3, restarts=2)
    with pytest.raises(ConfigError, match="block columns"):
        block_bootstrap(synthetic, "looped", block_cols=("budget",), n_resamples=3, restarts=2)


def test_fit_on_the_box_edge_says_so(synthetic):
    outside = synthetic_looped_frame(dict(PAPER_LOOPED, phi=3.5), noise=0.0, seed=0)
    edge = fit_frame(outside, "looped", restarts=5, seed=0)
    assert (
        not edge.identified and "do not identify" in edge.identification_note() and "phi" in edge.identification_note()
    )
    assert fit_frame(synthetic, "looped", restarts=20, seed=0).identification_note() == ""
    edge.ci = {"phi": [-3.0, 3.0]}
    assert "not a confidence interval" in edge.identification_note()


def test_warm_start_matches_cold_refit(synthetic, synthetic_fit):
    rng = np.random.default_rng(7)
    blocks = list(synthetic.groupby(["C", "r"]).indices.values())
    frame = synthetic.iloc[np.concatenate([blocks[j] for j in rng.integers(0, len(blocks), len(blocks))])]
    warm = fit_frame(frame, "looped", restarts=2, seed=1, extra_starts=[synthetic_fit.theta])
    cold = fit_frame(frame, "looped", restarts=60, seed=2)
    assert abs(warm.huber - cold.huber) <= 1e-9 * cold.huber
    assert np.allclose(warm.theta, cold.theta, rtol=1e-4, atol=1e-4)


def test_per_r_fits(synthetic):
    fits = _fit_per_r(synthetic, restarts=8, seed=0)
    assert sorted(fits) == [1, 2, 4, 8]
    for r, f in fits.items():
        assert f.law == "chinchilla" and f.n_points == 29 and f.provenance == "synthetic" and f.r2 > 0.99


def test_grid_accounting_matches_looped_module():
    grid = paper_grid_frame()
    assert len(grid) == 116
    acc = [paper_accounting(row.d_model, row.r) for row in grid.itertuples()]
    assert np.allclose([a.flops_per_token for a in acc], grid.flops_per_token, rtol=1e-12)
    assert np.allclose([a.n_once + a.n_rec for a in acc], grid.n_once + grid.n_rec)


def test_empirical_optimum_parabola():
    x = np.log([2e7, 4e7, 8e7, 1.6e8, 3.2e8])
    cells = pd.concat(
        [
            pd.DataFrame(dict(C=C, r=r, N=np.exp(x), loss=L0 + k * (x - x0) ** 2))
            for C, r, L0, k, x0 in [(1e18, 1, 2.7, 0.05, np.log(6e7)), (1e18, 2, 2.8, 0.08, np.log(9e6))]
        ]
    )
    opt = empirical_optima(cells).set_index("r")
    assert np.isclose(opt.loc[1, "N_star"], 6e7) and np.isclose(opt.loc[1, "L_star"], 2.7) and not opt.loc[1, "edge"]
    assert opt.loc[2, "edge"] and opt.loc[2, "convex"]  # optimum below the smallest sampled size


def test_law_optimum_against_brute_force():
    fit = FitResult(
        "looped",
        E=1.56773,
        A=28.027,
        B=915.82,
        alpha=0.19924,
        beta=0.36863,
        phi=0.459,
        phi_fixed=True,
        huber=0.0,
        r2=1.0,
        n_points=0,
        provenance="synthetic",
        theta=list(_theta_from_params(**PAPER_LOOPED)),
        restarts=0,
        seed=0,
        n_at_best=0,
    )
    for C, r in [(1e18, 1), (2.15e19, 8)]:
        opt = law_optimum(fit, C, r)
        widths = np.geomspace(64, 16384, 20000)
        losses = [
            fit.predict(fit.n_eff(a.n_once, a.n_rec, r), C / a.flops_per_token)
            for a in (paper_accounting(d, r) for d in widths)
        ]
        assert abs(opt["d"] / widths[int(np.argmin(losses))] - 1) < 1e-3 and opt["loss"] <= min(losses) + 1e-12


def test_worked_example():
    w = worked_example()
    assert abs(w["N_r1"] - 1e9) < 1e3 and abs(w["N_unique"] / 1e6 - 410) < 5  # ≈ 410M unique
    assert abs(w["eff_ratio_paper"] - 0.58) < 0.005 and 570e6 < w["N_eff"] < 600e6  # ≈ 580M effective
    assert 1.0 < w["flops_ratio"] < 1.03  # 1B model's FLOPs within 3 %


def test_cli_chinchilla_and_bootstrap(tmp_path, capsys):
    csv = tmp_path / "chin.csv"
    chinchilla_frame().to_csv(csv, index=False)
    assert main(["fit", "--csv", str(csv), "--law", "chinchilla", "--restarts", "20", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"E", "A", "B", "alpha", "beta", "huber", "r2", "n_points", "provenance"} <= set(out) and "phi" not in out
    assert out["n_points"] == 240 and abs(out["E"] - 1.8172) < 0.01
    assert out["provenance"] == "unspecified"  # a CSV without a provenance column is not assumed to be real runs
    assert (
        main(["fit", "--csv", str(csv), "--law", "chinchilla", "--restarts", "2", "--provenance", "real", "--json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["provenance"] == "real"
    syn = tmp_path / "syn.csv"
    synthetic_looped_frame(noise=0.005, seed=3).to_csv(syn, index=False)
    assert (
        main(["fit", "--csv", str(syn), "--restarts", "3", "--bootstrap", "3", "--boot-restarts", "1", "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["provenance"] == "synthetic" and set(out["ci"]) == {"E", "A", "B", "alpha", "beta", "phi"}
    assert out["bootstrap"]["block_cols"] == ["C", "r"] and out["bootstrap"]["n_blocks"] == 24
    assert all(lo <= hi for lo, hi in out["ci"].values())
    assert main(["fit", "--csv", str(syn), "--phi", "0", "--restarts", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["phi"] == 0


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda df: df.drop(columns=["n_rec"]), "missing n_rec"),
        (lambda df: df.assign(D=-df["D"]), "strictly positive"),
        (lambda df: df.assign(loss=df["loss"].where(df.index != 5)), "NaN"),
        (lambda df: df.iloc[:6], "too few points"),
        (lambda df: df.assign(r=0), "'r' must be >= 1"),
        (lambda df: df.assign(provenance="made-up"), "valid provenances"),
    ],
)
def test_bad_input_is_rejected(tmp_path, capsys, change, message):
    df = change(synthetic_looped_frame(noise=0.005, seed=0))
    with pytest.raises(ConfigError, match=message):
        fit_frame(df, "looped", restarts=1)
    csv = tmp_path / "bad.csv"
    df.to_csv(csv, index=False)
    assert main(["fit", "--csv", str(csv), "--restarts", "1"]) == 2
    assert message.split()[-1] in capsys.readouterr().err


def test_cli_rejects_unknown_law_and_missing_file(tmp_path, capsys):
    assert main(["fit", "--csv", str(tmp_path / "nope.csv")]) == 2
    with pytest.raises(SystemExit):
        main(["fit", "--csv", str(DATA), "--law", "kaplan"])
    csv = tmp_path / "c.csv"
    chinchilla_frame().to_csv(csv, index=False)
    assert main(["fit", "--csv", str(csv), "--law", "chinchilla", "--phi", "1"]) == 2


def test_cli_fit_defaults_to_the_papers_effort(tmp_path, capsys, monkeypatch):
    "500 restarts; for the looped law with phi free, 200 resamples x (500 + 1 warm) starts: passed through, and stated."
    syn = tmp_path / "syn.csv"
    synthetic_looped_frame(noise=0.005, seed=3).to_csv(syn, index=False)
    seen = {}
    real_fit, real_boot = scaling.fit_frame, scaling.block_bootstrap

    def fit(*a, **kw):
        seen["fit"] = kw
        return real_fit(*a, **dict(kw, restarts=3))  # run the fit itself small

    def boot(df, law, **kw):
        seen["boot"] = kw
        return real_boot(df, law, **dict(kw, n_resamples=2, restarts=2))

    monkeypatch.setattr(scaling, "fit_frame", fit)
    monkeypatch.setattr(scaling, "block_bootstrap", boot)
    assert main(["fit", "--csv", str(syn), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert seen["fit"]["restarts"] == 500 and seen["boot"]["n_resamples"] == 200 and seen["boot"]["restarts"] == 500
    assert seen["boot"]["warm_start"] is not None and seen["boot"]["block_cols"] == ["C", "r"]
    assert (
        out["bootstrap"]["warm_start"] and "best_from_warm_start" in out["bootstrap"] and "warm start" in out["effort"]
    )
    seen.clear()
    assert main(["fit", "--csv", str(syn), "--phi", "1", "--json"]) == 0  # the paper bootstraps only the free law
    assert "boot" not in seen and "bootstrap" not in json.loads(capsys.readouterr().out)
