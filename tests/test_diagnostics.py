"Diagnostics: known answers, naive references, the real designs through the DepthModel interface, run folders, CLI."

import contextlib
import io
import json
import math

import pytest
import torch

from depthbench_nb.config import ConfigError, ModelConfig
from depthbench_nb.diagnostics import (
    angular_distance_matrix,
    causal_row,
    check_metrics,
    completion_nll,
    dead_zone,
    diagnose_model,
    effective_rank,
    _forward_product,
    _last_three_quarters,
    lm_loss,
    logit_lens,
    _mixing_stats,
    permutation_matrix,
    run_diagnostics,
    _spectrum_stats,
    _sublayer_partial_mass,
    summarize_causal,
    summarize_permutation,
    usefulness,
)
from depthbench_nb.hf_diagnostics import cli_diagnose  # the diagnose command (run folders and Transformers models)
from depthbench_nb.model import build_model

V = 64


def tiny(arch="preln", L=4, **kw):
    cfg = ModelConfig(arch=arch, n_layer=L, d_model=32, n_head=2, vocab_size=V, max_seq_len=64, **kw)
    return build_model(cfg, seed=0).eval(), cfg


@pytest.fixture
def xy():
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, V, (3, 12), generator=g), torch.randint(0, V, (3, 12), generator=g)


def make_identity(model, b):
    "Pre-LN block b becomes x -> x: zero its attention output and FFN down projections."
    with torch.no_grad():
        model.blocks[b].attn.wo.weight.zero_()
        model.blocks[b].ffn.w2.weight.zero_()


# ---- angular distance ---------------------------------------------------------------------------------------------
def test_angular_matches_the_definition_token_by_token():
    g = torch.Generator().manual_seed(1)
    states = [torch.randn(2, 3, 5, generator=g, dtype=torch.float64) for _ in range(4)]
    A = angular_distance_matrix(states)
    for i in range(4):
        for j in range(4):
            per_token = [
                math.acos(
                    max(
                        -1,
                        min(
                            1,
                            float(
                                torch.dot(states[i][b, t], states[j][b, t])
                                / (states[i][b, t].norm() * states[j][b, t].norm())
                            ),
                        ),
                    )
                )
                / math.pi
                for b in range(2)
                for t in range(3)
            ]
            assert A[i, j] == pytest.approx(0 if i == j else sum(per_token) / 6, abs=1e-9)


def test_angular_identical_states_zero_and_opposite_one():
    z = torch.randn(2, 4, 8)
    A = angular_distance_matrix([z, z.clone(), -z])
    assert A[0, 1] < 1e-7 and A[0, 2] == pytest.approx(1.0, abs=1e-7)


# ---- causal score, pruning ------------------------------------------------------------------------------------------
def test_causal_row_matches_a_naive_loop(xy):
    model, _ = tiny()
    x, _ = xy
    with torch.no_grad():
        _, base = model(x, return_states=True)
        _, skipped = model(x, skip={1}, return_states=True)
    row = causal_row(base, skipped, 1)
    for layer in range(2, 4):
        u, v = base[layer + 1] - base[layer], skipped[layer + 1] - skipped[layer]
        ratios = [
            float((v[b, t] - u[b, t]).norm() / max(float(u[b, t].norm()), 1e-8)) for b in range(3) for t in range(12)
        ]
        assert float(row[layer]) == pytest.approx(sum(ratios) / len(ratios), rel=1e-5)
    assert torch.isnan(row[:2]).all()


def test_identity_block_has_zero_causal_pruning_and_permutation_scores(xy):
    model, cfg = tiny(L=5)
    make_identity(model, 1)
    make_identity(model, 3)
    x, y = xy
    res = diagnose_model(model, cfg, x, y, metrics=["causal", "pruning", "permutation"])
    C = res["causal"]["matrix"]
    assert all(abs(C[1][b]) < 1e-6 for b in range(2, 5)) and all(abs(C[3][b]) < 1e-6 for b in range(4, 5))
    assert abs(res["pruning"]["delta_loss"][1]) < 1e-6 and abs(res["pruning"]["delta_loss"][3]) < 1e-6
    assert abs(res["permutation"]["matrix"][1][3]) < 1e-6  # swapping two identity blocks changes nothing
    assert res["causal"]["matrix"][0][2] > 1e-3  # ... while a real block does matter


def test_summaries_and_thresholds():
    L = 8
    C = torch.full((L, L), float("nan"), dtype=torch.float64)
    for s in range(L - 1):
        C[s, s + 1 :] = 0.5 if s >= 4 else 0.1
    sc = summarize_causal(C)
    assert list(_last_three_quarters(L)) == [2, 3, 4, 5, 6, 7]
    # the paper counts late pairs (s, l), s < l, both in 2..7: C(6, 2) = 15; above 0.45 those with s >= 4: 3 + 2 + 1 = 6
    assert sc.frac_above == pytest.approx(6 / 15) and (sc.extra["late_pairs"], sc.extra["late_pairs_above"]) == (15, 6)
    assert sc.per_layer[4] == 0.5 and math.isnan(sc.per_layer[7])
    # by per-layer means (not the paper's summary, kept under its own name):
    # late layers with a successor 2..6, above: 4, 5, 6
    assert sc.extra["frac_layers_mean_above"] == pytest.approx(3 / 5)
    # a single late pair above the threshold among 15 moves the fraction by exactly 1/15;
    # one outside the late blocks not at all
    C2 = C.clone()
    C2[2, 3] = 0.9
    C2[0, 1] = 0.9
    assert summarize_causal(C2).frac_above == pytest.approx(7 / 15)
    P = torch.full((L, L), float("nan"), dtype=torch.float64)
    for i in range(L):
        for j in range(i + 1, L):
            P[i, j] = 0.2 if j == 7 else 0.0
    sp = summarize_permutation(P)
    # late pairs: C(6, 2) = 15; those with j = 7: 5
    assert sp.frac_above == pytest.approx(5 / 15) and sp.per_layer[7] == pytest.approx(0.2)


# ---- permutation score -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["preln", "lns", "keel", "hc", "mhc"])
def test_shared_prefix_permutation_equals_the_naive_loop(arch, xy):
    model, _ = tiny(arch)
    x, y = xy
    P_shared, base, how = permutation_matrix(model, x, y, method="auto")
    P_naive, base2, _ = permutation_matrix(model, x, y, method="naive")
    assert how == "shared" and base == base2
    assert torch.allclose(P_shared.nan_to_num(), P_naive.nan_to_num(), atol=2e-6)
    assert (P_naive.nan_to_num() > 0).any()


@pytest.mark.parametrize("arch", ["attnres", "moda"])
def test_auto_falls_back_where_blocks_talk_outside_their_outputs(arch, xy):
    model, _ = tiny(arch)
    x, y = xy
    P, _, how = permutation_matrix(model, x, y, method="auto")
    assert how == "naive"
    assert torch.allclose(P.nan_to_num(), permutation_matrix(model, x, y, method="naive")[0].nan_to_num())


@pytest.mark.parametrize("arch", ["preln", "hc"])
def test_identical_blocks_swaps_change_nothing(arch, xy):
    model, _ = tiny(arch)
    with torch.no_grad():
        for blk in model.blocks[1:]:
            for (n, p), q in zip(blk.named_parameters(), model.blocks[0].parameters()):
                if "hc" not in n:
                    p.copy_(q)  # HC's static one-hot read stays with the position, swapped with the block
    x, y = xy
    P, _, _ = permutation_matrix(model, x, y)
    assert P.nan_to_num().abs().max() < 1e-6


# ---- usefulness, collapse, logit lens --------------------------------------------------------------------------------
def test_usefulness_identity_block_is_exactly_affine(xy):
    model, _ = tiny()
    make_identity(model, 2)
    x, y = xy
    u = usefulness(model, x, y)
    assert u["loss_ratio"][2] == pytest.approx(1.0, abs=1e-5) and not u["significant"][2]
    assert u["global_score"] == sum(u["significant"]) / 4


def test_spectrum_stats_known_answers():
    s = _spectrum_stats(torch.diag(torch.tensor([3.0, 1.0])))
    p = torch.tensor([9 / 10, 1 / 10])
    assert s["stable_rank"] == pytest.approx(10 / 9) and s["l1_l2"] == pytest.approx(4 / math.sqrt(10))
    assert s["erank"] == pytest.approx(math.exp(-float((p * p.log()).sum())))


def test_logit_lens_final_state_agrees_with_the_output(xy):
    for arch in ("preln", "mhc"):
        model, _ = tiny(arch)
        x, y = xy
        with torch.no_grad():
            logits, states = model(x, return_states=True)
        ll = logit_lens(model, states, y, logits)
        assert len(ll) == 5 and ll[-1]["top5_overlap"] == 1.0 and ll[-1]["kl_to_final"] < 1e-5
        assert ll[-1]["ce"] == pytest.approx(float(lm_loss(logits, y)), rel=1e-5)


# ---- mixing structure, dead zone -------------------------------------------------------------------------------------
def test_mixing_erank_known_answers():
    n = 4
    assert _mixing_stats(torch.eye(n).repeat(10, 2, 3, 1, 1))["mixing_erank"] == pytest.approx(n)
    g = torch.Generator().manual_seed(3)
    M = torch.rand(40, 5, n, n, generator=g, dtype=torch.float64) + 0.05
    for _ in range(300):
        M = M / M.sum(-1, keepdim=True)
        M = M / M.sum(-2, keepdim=True)
    st = _mixing_stats(M)
    assert st["mixing_erank"] == pytest.approx(1.0, abs=1e-3) and st["distance_to_uniform"] < 1e-3
    # a permutation matrix keeps full rank; the product is taken in forward order (later sites on the left)
    A, B = torch.tensor([[1.0, 2.0], [0.0, 1.0]]), torch.tensor([[1.0, 0.0], [3.0, 1.0]])
    assert torch.equal(_forward_product(torch.stack([A, B])), (B @ A).double())
    assert float(effective_rank(torch.eye(3)[[2, 0, 1]])) == pytest.approx(3.0)


def test_mixing_on_real_hc_and_mhc(xy):
    x, y = xy
    hc, cfg = tiny("hc")
    M = hc.mixing_matrices(x)
    assert M.shape == (8, 3, 12, 4, 4)
    assert diagnose_model(hc, cfg, x, y, metrics=["mixing"])["mixing"]["mixing_erank"] == pytest.approx(
        4.0, abs=1e-6
    )  # init: identity
    mhc, cfg = tiny("mhc")
    st = diagnose_model(mhc, cfg, x, y, metrics=["mixing"])["mixing"]
    assert 3.9 < st["mixing_erank"] < 4.0  # gap-8 init: near-identity doubly stochastic
    assert st["amax_forward"] == pytest.approx(1.0, abs=1e-4)  # doubly stochastic products keep row sums 1


def test_dead_zone_on_block_attnres(xy):
    x, y = xy
    model, cfg = tiny("block_attnres", L=8)  # 16 sublayers, 8 blocks of 2
    mass = _sublayer_partial_mass(model.depth_mix_weights(x), cfg)
    # zero pseudo-queries: uniform weights, so the partial gets 1/S; odd sublayers have a partial, S = 2, 3, ...
    assert mass[0] is None and mass[2] is None
    assert [round(m, 6) for m in mass[1::2]] == [round(1 / s, 6) for s in range(2, 10)]
    assert dead_zone(mass)["dead_layers"] == 0  # sublayer 1 already gives the partial 1/2
    assert dead_zone(mass, threshold=0.3)["dead_sublayers"] == 0
    assert dead_zone(mass, threshold=0.55)["dead_layers"] == 7.5  # nothing ever reaches 0.55: sublayers 1..15
    assert dead_zone([None, 0.01, None, 0.02, None, 0.4])["dead_sublayers"] == 4
    res = diagnose_model(model, cfg, x, y, metrics=["dead_zone"])
    assert res["dead_zone"]["dead_layers"] == 0


# ---- applicability and bad input -------------------------------------------------------------------------------------
def test_metrics_that_do_not_apply_are_clear_errors():
    pre = ModelConfig(arch="preln", n_layer=4, d_model=32, n_head=2)
    with pytest.raises(ConfigError, match="multistream"):
        check_metrics(["mixing"], pre)
    with pytest.raises(ConfigError, match="block_attnres"):
        check_metrics("dead_zone", pre)
    with pytest.raises(ConfigError, match="valid metrics"):
        check_metrics(["nope"], pre)
    with pytest.raises(ConfigError, match="usefulness"):
        check_metrics(["usefulness"], pre.replace(arch="attnres"))
    assert "mixing" in check_metrics(None, pre.replace(arch="hc")) and "mixing" not in check_metrics(None, pre)


def test_completion_nll_scores_only_the_completion():
    model, _ = tiny()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([[5, 6, 7, 8]]))[0], -1)
    r = completion_nll(model, [([5, 6], [7, 8])])
    assert r["tokens"] == 2 and r["nll_sum"] == pytest.approx(float(-logp[1, 7] - logp[2, 8]), rel=1e-5)


# ---- a run folder in, diagnostics out --------------------------------------------------------------------------------
def _checkpointed_run(arch="preln", data=None):
    from depthbench_nb.runs import write_params
    from depthbench_nb.runs import save_checkpoint
    from depthbench_nb.run_params import make_run_config
    from depthbench_nb.runs import run_dir

    run = make_run_config(arch, L=4, d_model=32, preset="tiny", max_steps=1, verbose=False, data=data)
    folder = run_dir(run)
    write_params(folder, run)
    model = build_model(run.model)
    return run, folder, model, save_checkpoint


def test_run_folder_without_checkpoint_is_a_clear_error(runs_dir):
    _, folder, _, _ = _checkpointed_run()
    with pytest.raises(ConfigError, match="checkpoint"):
        run_diagnostics(folder)
    with pytest.raises(ConfigError, match="does not exist"):
        run_diagnostics(runs_dir / "nowhere")


def test_run_diagnostics_writes_tables_and_figures(runs_dir, tiny_data):
    run, folder, model, save_checkpoint = _checkpointed_run("hc", data=str(tiny_data))
    save_checkpoint(folder, 1, run, model, [], [], {})
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        cli_diagnose(
            [
                str(folder),
                "--metrics",
                "angular,causal,permutation,mixing",
                "--n-samples",
                "2",
                "--seq-len",
                "16",
                "--json",
            ]
        )
    out = json.loads(buf.getvalue())
    assert out["mixing_erank"] == pytest.approx(4.0, abs=1e-5) and 0 <= out["permutation_frac_late_above"] <= 1
    names = {p.split("/")[-1] for p in out["files"]}
    assert {
        "diagnostics.json",
        "per_layer.csv",
        "summary.json",
        "angular.png",
        "causal.png",
        "permutation.png",
    } <= names
    full = json.loads((folder / "diagnostics" / "diagnostics.json").read_text())
    assert len(full["angular"]["matrix"]) == 5 and full["n_samples"] == 2 and full["seq_len"] == 16
    with pytest.raises(ConfigError, match="multistream"):
        run_diagnostics(folder.parent / folder.name, metrics=["dead_zone"])


# ---- looped models and the NLL metrics -------------------------------------------------------------------------------
def test_looped_model_through_the_interface(xy):
    cfg = ModelConfig(arch="looped", n_layer=20, d_model=32, n_head=2, vocab_size=V, max_seq_len=64, recurrence=8)
    model = build_model(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(1000)  # the paper's 1e-3 head init makes every loss ~log V
    x, y = xy
    assert model.schedule[2] == model.schedule[4] != model.schedule[3]  # r = 8: a 2-layer recurrent block
    P, base, how = permutation_matrix(model, x, y, pairs=[(0, 5), (2, 4), (3, 12)])
    assert how == "naive" and int((~P.isnan()).sum()) == 3
    # swapping two executions of the same shared layer changes nothing; swapping a prelude layer does
    assert float(P[2, 4]) == 0 and float(P[0, 5]) > 1e-4
    with pytest.raises(ConfigError, match="usefulness"):
        check_metrics(["usefulness"], cfg)
    with pytest.raises(ConfigError, match="looped"):
        permutation_matrix(model, x, y, method="shared")


def test_domain_and_downstream_nll_by_category(xy):
    model, cfg = tiny()
    x, y = xy
    sets = {
        "domain": {"a": ("math", [([1, 2], [3, 4])]), "b": ("math", [([5], [6, 7, 8])]), "c": ("stem", [([9], [10])])},
        "downstream": {"boolq": ("reading_comprehension", [([1], [2])])},
    }
    res = diagnose_model(model, cfg, x, y, metrics=["domain_nll", "downstream_nll"], domain_sets=sets)
    per_set = res["domain_nll"]["sets"]
    math_cat = res["domain_nll"]["by_category"]["math"]
    assert math_cat["tokens"] == 5 and math_cat["nll_mean"] == pytest.approx(
        (per_set["a"]["nll_sum"] + per_set["b"]["nll_sum"]) / 5
    )
    assert per_set["a"]["category"] == "math" and per_set["a"]["nll_sum"] == pytest.approx(
        completion_nll(model, [([1, 2], [3, 4])])["nll_sum"]
    )
    assert set(res["downstream_nll"]["by_category"]) == {"reading_comprehension"}
    with pytest.raises(ConfigError, match="evaluation sets"):
        diagnose_model(model, cfg, x, y, metrics=["domain_nll"])


def test_usefulness_needs_more_tokens_than_the_state_dimension():
    model, cfg = tiny("hc")  # state n·d = 128
    x = torch.randint(0, V, (2, 8))
    y = torch.randint(0, V, (2, 8))
    with pytest.raises(ConfigError, match="more than 129 tokens"):
        usefulness(model, x, y)
    res = diagnose_model(model, cfg, x, y)  # the default set says why and keeps going
    assert "usefulness" not in res and "more than" in res["skipped"]["usefulness"] and "mixing" in res
