"""The DepthBench claims through the one verdict rule: on records at the paper's setting (the 400M main
benchmark at its official steps, written as a finished sweep leaves them, as in test_depthbench_report.py) a claim is
`reproduced` or `NOT reproduced` both ways, read where the paper reads it (L16 -> L32, thresholds at L = 32) and beyond
a noise margin; on tiny records no claim but a scale-free one has a verdict; an invalid measurement (a CPU's time, a
process's memory, the cost model's own prediction) is `not measured`; and every finding of the paper has a row."""

import numpy as np
import pandas as pd
import pytest

from depthbench_nb import report_common, report_depthbench
from depthbench_nb.report_common import Report, RunScale

from test_depthbench_report import record

WORDS = ("reproduced", "NOT reproduced")


def claims_of(study, tmp_path_factory, records) -> pd.DataFrame:
    "The claims table of `study`'s report after writing `records` (arch, L, preset, loss[, options])."
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DEPTHBENCH_RUNS", str(tmp_path_factory.mktemp(f"{study}-runs")))
        for arch, L, preset, loss, *opts in records:
            record(arch, L, preset, loss, study=study, **(opts[0] if opts else {}))
        out = tmp_path_factory.mktemp(f"{study}-report")
        report_depthbench.build_depthbench_report(study, out_dir=out)
        return pd.read_csv(out / "depthbench_claims.csv").set_index("claim")


def verdict(claims: pd.DataFrame, like: str) -> str:
    rows = claims.filter(like=like, axis=0)
    assert len(rows) == 1, (like, list(claims.index))
    return rows.verdict.iloc[0]


PAPER = [  # the paper's 400M Figure 2 numbers where it states them, and directions chosen to test both verdicts
    ("preln", 16, "400m", 2.759),
    ("preln", 32, "400m", 2.782),
    ("preln", 70, "400m", 2.700),  # the preset's deepest shape improves: the paper does not read L70
    ("attnres", 16, "400m", 2.751),
    ("attnres", 32, "400m", 2.718),
    ("hc", 16, "400m", 2.699),  # HC made worse with depth: "HC improves" must fail
    ("hc", 32, "400m", 2.729),
    ("block_attnres", 16, "400m", 2.730),
    ("block_attnres", 20, "400m", 2.715),
    ("block_attnres", 32, "400m", 2.730),
    ("keel", 16, "400m", 2.760),
    ("keel", 24, "400m", 2.750),
    ("keel", 32, "400m", 2.752),  # weak: best at L24
    ("moda", 16, "400m", 2.800),
    ("moda", 32, "400m", 2.700),  # improves by 0.1: "weak" must fail
]


@pytest.fixture(scope="module")
def paper_claims(tmp_path_factory):
    return claims_of("verdicts-paper", tmp_path_factory, PAPER)


@pytest.fixture(scope="module")
def tiny_claims(tmp_path_factory):
    tiny = [(a, L, "tiny", loss, dict(d_model=32)) for a, L, loss in (("preln", 2, 3.10), ("preln", 4, 3.20))]
    tiny += [(a, L, "tiny", loss, dict(d_model=32)) for a, L, loss in (("hc", 2, 3.05), ("hc", 4, 2.95))]
    tiny += [("attnres", L, "tiny", loss, dict(d_model=32)) for L, loss in ((2, 3.0), (4, 2.9))]
    return claims_of("verdicts-tiny", tmp_path_factory, tiny)


def test_depth_trends_at_the_paper_setting_are_read_from_l16_to_l32_both_ways(paper_claims):
    assert verdict(paper_claims, "Pre-LN gets worse") == "reproduced"  # L16 -> L32, not L16 -> L70
    assert "L32 - L16 = +0.023" in paper_claims.filter(like="Pre-LN gets worse", axis=0).found.iloc[0]
    assert verdict(paper_claims, "Full AttnRes improves") == "reproduced"
    assert verdict(paper_claims, "HC improves") == "NOT reproduced"
    assert verdict(paper_claims, "Block AttnRes is best at a middle depth") == "reproduced"


def test_the_weak_normalization_and_depth_attention_designs_have_rows_with_verdicts(paper_claims):
    assert verdict(paper_claims, "KEEL is weak") == "reproduced"
    assert verdict(paper_claims, "MoDA is weak") == "NOT reproduced"
    assert verdict(paper_claims, "LNS is weak").startswith("not checkable")  # no LNS run


def test_every_seed_finding_has_a_row_with_its_artifact_and_the_paper_version(paper_claims):
    findings = {
        "Sandwich-LN / Peri-LN is weak": "depthbench_val_loss",
        "LNS is weak": "depthbench_val_loss",
        "DeepNorm is weak": "depthbench_val_loss",
        "KEEL is weak": "depthbench_val_loss",
        "MoDA is weak": "depthbench_val_loss",
        "300M fixed-backbone control": "depthbench_val_loss",
        "Full AttnRes depth trend holds at 200M-500M and at 1.6B": "depthbench_val_loss",
        "coding, STEM and math": "depthbench_domain_nll",
        "Pre-LN family's layers become more similar": "depthbench_angular_summary",
        "HC and AttnRes keep large, non-smooth": "depthbench_angular_summary",
        "Block AttnRes is smooth within blocks": "depthbench_angular_summary",
        "gradient explosion in its largest-ratio 500M run": "depthbench_runs_not_completed",
        "no clear depth gain at 1.6B": "depthbench_val_loss",
        "LR-sensitive": "depthbench_lr_sweep",
    }
    for like, artifact in findings.items():
        row = paper_claims.filter(like=like, axis=0)
        assert len(row) == 1 and row.artifact.iloc[0] == artifact, like
        assert row.source.iloc[0].startswith("DepthBench, arXiv 2609.32534 (as quoted on the project page"), like
    # a finding the runs cannot give yet says which study builds it
    assert "(the `ladder` study)" in verdict(paper_claims, "200M-500M and at 1.6B")
    assert "(the `depthbench-1.6b` study)" in verdict(paper_claims, "no clear depth gain at 1.6B")
    assert "(the `backbone-300m` study)" in verdict(paper_claims, "300M fixed-backbone control")


def test_tiny_runs_are_not_comparable_and_still_show_the_direction(tiny_claims):
    pre = tiny_claims.filter(like="Pre-LN gets worse", axis=0).iloc[0]
    assert pre.verdict.startswith("not comparable: ") and pre.found.startswith("L2 3.100, L4 3.200")
    assert verdict(tiny_claims, "HC improves").startswith("not comparable: ")
    judged = tiny_claims[tiny_claims.verdict.isin(WORDS)]
    assert (judged.scale == "any scale").all(), judged[["verdict", "scale"]]  # accounting only
    assert len(judged) == 2  # the prefill and KV-cache accounting
    assert not tiny_claims.verdict.str.contains("reproduced").drop(judged.index).any()


def test_unmeasured_costs_are_not_measured(paper_claims, tiny_claims):
    "The runs here are timed on a CPU and their memory is the process's: neither cost ranking has a verdict."
    for claims in (paper_claims, tiny_claims):
        for like in ("highest peak memory", "most GPU-hours"):
            v = verdict(claims, like)
            assert "not measured" in v and "reproduced" not in v, v


def cost_frames(device, per_run):
    from depthbench_nb.costs import cost_row
    from depthbench_nb.shapes import grid_shapes

    costs = pd.DataFrame(
        [cost_row(s.model_config(a), seq_len=4096) for s in grid_shapes("400m") for a in ("preln", "hc", "attnres")]
    )
    costs["ratio"] = costs.d_model / costs.n_layer
    gpu = report_depthbench._gpu_hours_frame(costs, pd.DataFrame())
    measured = pd.DataFrame(
        dict(
            arch=["preln", "hc", "attnres"],
            preset="400m",
            n_layer=32,
            d_model=896,
            peak_mem_bytes=[1.0, 2.0, 3.0],
            tokens_per_s_median=[300.0, 100.0, 200.0],
            device=device,
            peak_mem_per_run=per_run,
        )
    )
    return costs, gpu, measured


def test_measured_costs_are_verdicted_only_when_valid_both_ways():
    on_a100 = report_depthbench.depthbench_cost_claims(*cost_frames("NVIDIA A100-SXM4-40GB", True))
    model_mem, run_mem, model_hours, run_time = on_a100.verdict
    assert model_mem.startswith("not measured: the cost model's prediction")  # a prediction, never a reproduction
    assert on_a100.found[0].startswith("predicted: ")
    assert (run_mem, run_time) == ("reproduced", "reproduced")  # per-run GPU memory, A100 seconds per token
    assert model_hours.startswith("not measured: ") and "FLOP estimate" in model_hours
    costs, gpu, m = cost_frames("NVIDIA A100-SXM4-40GB", True)
    fast_hc = m.assign(tokens_per_s_median=[300.0, 400.0, 200.0], peak_mem_bytes=[5.0, 2.0, 3.0])
    flipped = report_depthbench.depthbench_cost_claims(costs, gpu, fast_hc).verdict
    assert (flipped[1], flipped[3]) == ("NOT reproduced", "NOT reproduced")
    on_cpu = report_depthbench.depthbench_cost_claims(*cost_frames("cpu (x86_64, 2 cores)", False)).verdict
    assert on_cpu[1].startswith("not measured") and on_cpu[3] == "not measured: timed on cpu (x86_64, 2 cores)"
    on_h100 = report_depthbench.depthbench_cost_claims(*cost_frames("NVIDIA H100 80GB HBM3", True)).verdict
    assert on_h100[1] == "reproduced" and on_h100[3].startswith("not measured: timed on NVIDIA H100")


def judged(claims, tables: dict, tmp_path) -> pd.Series:
    "The claims table of a report at the paper's setting whose artifacts are `tables` (stem -> frame)."
    rep = Report("t", "depthbench", RunScale(("400m",), True, "runs", 1, 1), tmp_path)
    for stem, t in tables.items():
        rep.table(t, stem, stem)
    return report_common.claims_table(rep, claims).set_index("claim").verdict


def test_threshold_fractions_are_read_at_l32_with_a_margin(tmp_path):
    claim = next(c for c in report_depthbench._DEPTHBENCH_CLAIMS if c.claim.startswith("late-layer pairs with causal"))
    t = pd.DataFrame(
        dict(
            arch=["preln", "hc", "attnres"] * 2,
            preset="400m",
            n_layer=[32] * 3 + [70] * 3,
            causal_frac_pairs_045=[0.01, 0.07, 0.16, 0.30, 0.20, 0.10],  # L70 reverses the order: not read
            comparable=True,
            what_differs="",
        )
    )
    assert judged([claim], {"depthbench_threshold_fractions": t}, tmp_path).iloc[0] == "reproduced"
    close = t.assign(causal_frac_pairs_045=[0.01, 0.07, 0.08, 0.0, 0.0, 0.0])  # attnres above hc by 1 point only
    assert judged([claim], {"depthbench_threshold_fractions": close}, tmp_path).iloc[0] == "NOT reproduced"


def test_a_depth_order_inside_the_replicates_noise_is_not_reproduced(tmp_path):
    "Two cells 0.004 apart (the size of Table 5's 2.793 vs 2.797): seeds spread 0.006 make it noise, 0.0005 do not."
    claim = next(c for c in report_depthbench._DEPTHBENCH_CLAIMS if c.claim.startswith("Pre-LN gets worse"))
    t = pd.DataFrame(
        dict(arch="preln", preset="400m", n_layer=[16, 32], val_loss=[2.793, 2.797], n_replicates=3)
    ).assign(comparable=True, what_differs="")
    noisy = judged([claim], {"depthbench_val_loss": t.assign(val_loss_std=0.006)}, tmp_path).iloc[0]
    tight = judged([claim], {"depthbench_val_loss": t.assign(val_loss_std=0.0005)}, tmp_path).iloc[0]
    assert (noisy, tight) == ("NOT reproduced", "reproduced")
    single = t.assign(n_replicates=1, val_loss_std=np.nan)  # one seed: the stated margin, 0.005 nats
    assert judged([claim], {"depthbench_val_loss": single}, tmp_path).iloc[0] == "NOT reproduced"
