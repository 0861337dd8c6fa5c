"Costs: hand counts, torch.utils.flop_counter on the backbone, the paper's figures, the looped closed form, the CLI."

import contextlib
import io
import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from depthbench_nb.config import ConfigError, ModelConfig
from depthbench_nb.costs import (
    cli_costs,
    cost_row,
    depth_cache_bytes,
    _design_forward_flops_per_token,
    kv_cache_bytes,
    _olmo_core_flops_per_token,
    prefill_flops,
    train_flops_per_token,
)
from depthbench_nb.model import attnres_sources_per_site
from depthbench_nb.shapes import shape_for

TINY = dict(n_layer=2, d_model=8, n_head=2, ffn_hidden=16, vocab_size=32, max_seq_len=64)


def test_hand_count_tiny_preln():
    cfg = ModelConfig(arch="preln", **TINY)
    # by hand: per block W_q, W_k, W_v, W_o 4*8*8 = 256 and SwiGLU 3*8*16 = 384 -> 640; two blocks 1280;
    # LM head 32*8 = 256
    assert train_flops_per_token(cfg, 4) == 6 * (1280 + 256) + 12 * 2 * 8 * 4  # = 9984
    assert train_flops_per_token(cfg, 4) == 9984
    # prefill of 4 tokens: matmuls 2*1280*4, causal attention 2*L*T^2*d = 2*2*16*8, LM head at the last position 2*256
    assert prefill_flops(cfg, 4) == 10240 + 512 + 512
    assert kv_cache_bytes(cfg, 4) == 2 * 2 * 4 * 8 * 2


def test_against_torch_flop_counter_on_the_backbone():
    from depthbench_nb.model import build_model

    aten = torch.ops.aten
    # the CPU flash-attention op is not in the counter's registry: count it with the counter's own SDPA formulas
    mapping = {
        aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *a, **kw: sdpa_flop_count(q, k, v),
        aten._scaled_dot_product_flash_attention_for_cpu_backward: lambda g, q, k, v, *a, **kw: (
            sdpa_backward_flop_count(g, q, k, v)
        ),
    }
    cfg = ModelConfig(arch="preln", n_layer=2, d_model=32, n_head=2, ffn_hidden=48, vocab_size=64, max_seq_len=64)
    model = build_model(cfg)
    B, T = 2, 16
    x = torch.randint(0, 64, (B, T))
    with FlopCounterMode(display=False, custom_mapping=mapping) as fc:
        F.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
    counts = {str(k): v for k, v in fc.get_flop_counts()["Global"].items()}
    attn_fwd = counts["aten._scaled_dot_product_flash_attention_for_cpu"]
    attn_bwd = counts["aten._scaled_dot_product_flash_attention_for_cpu_backward"]
    ours = train_flops_per_token(cfg, T) * B * T
    # matmuls: forward + backward of every linear layer = 6 x matmul params per token, exactly
    assert counts["aten.mm"] == ours - 12 * cfg.n_layer * cfg.d_model * T * B * T
    # attention forward: our 4·L·d·T per token (a third of OLMo-core's 12·L·d·T) is the counter's SDPA count
    assert attn_fwd == 4 * cfg.n_layer * cfg.d_model * T * B * T
    # the counter charges the flash backward 2.5x the forward (it includes the recomputed scores); OLMo-core's
    # convention, which we keep, charges 2x and does not count recomputation
    assert attn_bwd == 2.5 * attn_fwd


def test_paper_prefill_and_kv_cache():
    s16, s70 = (shape_for("400m", L).model_config("preln") for L in (16, 70))
    # the DepthBench paper (arXiv 2609.32534), costs of depth: prefill about 3.0 -> 4.4 TFLOPs per 4096-token
    # sequence; the KV cache more than doubles
    assert prefill_flops(s16, 4096) == pytest.approx(3.0e12, rel=0.02)
    assert prefill_flops(s70, 4096) == pytest.approx(4.4e12, rel=0.02)
    assert kv_cache_bytes(s70, 4096) > 2 * kv_cache_bytes(s16, 4096)


def test_design_extras_are_counted_but_not_by_olmo_core():
    base = shape_for("400m", 24)
    for arch in ("hc", "mhc", "attnres", "block_attnres", "moda"):
        cfg = base.model_config(arch)
        assert _design_forward_flops_per_token(cfg) > 0
        assert train_flops_per_token(cfg, 2048) == _olmo_core_flops_per_token(
            cfg, 2048
        ) + 3 * _design_forward_flops_per_token(cfg)
    assert _design_forward_flops_per_token(base.model_config("preln")) == 0
    # HC, per sublayer n·d·(4n + 11) at n = 4: by hand 4·1024·27 per sublayer, 48 sublayers
    assert _design_forward_flops_per_token(base.model_config("hc")) == 48 * 4 * 1024 * 27
    # MoDA's depth attention: block b attends to 2b entries, 4·d FLOPs each -> 4·d·L(L-1)
    assert _design_forward_flops_per_token(base.model_config("moda")) == 4 * 1024 * 24 * 23
    # Full AttnRes mixing grows quadratically with depth at a fixed width
    wide = dict(d_model=64, n_head=4)
    r = _design_forward_flops_per_token(
        ModelConfig(arch="attnres", n_layer=32, **wide)
    ) / _design_forward_flops_per_token(ModelConfig(arch="attnres", n_layer=16, **wide))
    assert 3.5 < r < 4.1


def test_attnres_sources_match_the_model():
    from depthbench_nb.model import build_model

    for arch, L in (("attnres", 3), ("block_attnres", 6)):
        cfg = ModelConfig(arch=arch, n_layer=L, d_model=16, n_head=2, vocab_size=32)
        model = build_model(cfg)
        weights = model.depth_mix_weights(torch.randint(0, 32, (1, 5)))
        expected = attnres_sources_per_site(model.group_sizes)  # the one grouping rule, as the costs count it
        assert [w.shape[-1] for w in weights][1:] == expected[1:]  # sublayer 0 reads the embedding alone


def test_moda_depth_cache_is_its_own_column():
    "The paper's KV cache is the same for every design at a shape; MoDA's depth cache is a separate, labelled number."
    moda, preln = ModelConfig(arch="moda", **TINY), ModelConfig(arch="preln", **TINY)
    assert kv_cache_bytes(moda, 4) == kv_cache_bytes(preln, 4) == 2 * 2 * 4 * 8 * 2
    assert (
        depth_cache_bytes(moda, 4) == 2 * 4 * 4 * 8 * 2 and depth_cache_bytes(preln, 4) == 0
    )  # K, V x T x 2L slots x width x bf16
    row = cost_row(moda, seq_len=4)
    assert row["kv_cache_bytes"] == kv_cache_bytes(preln, 4) and row["depth_cache_bytes"] == depth_cache_bytes(moda, 4)


def test_looped_flops_match_the_paper_closed_form():
    from depthbench_nb.looped import looped_config

    # arXiv 2604.21106 §3.2, Eq. 1: s = 6, r = 1 gives 4.7505e8 FLOPs per token
    assert train_flops_per_token(looped_config(6, 1), 2048) == pytest.approx(4.7505e8, rel=1e-4)
    # recurrence executes layers: the r = 4 model costs more per token than its unique parameters suggest
    assert train_flops_per_token(looped_config(6, 4), 2048) > train_flops_per_token(looped_config(6, 1), 2048)
    assert prefill_flops(looped_config(6, 4), 2048) > 0


def test_bad_input():
    with pytest.raises(ConfigError, match="seq_len"):
        prefill_flops(ModelConfig(**TINY), 0)
    with pytest.raises(ConfigError, match="architecture"):
        cli_costs(["--arch", "nope"])


def test_cli_json_rows():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        cli_costs(["--grid", "400m", "--arch", "hc", "--depths", "16,32", "--json"])
    rows = json.loads(buf.getvalue())
    assert [r["n_layer"] for r in rows] == [16, 32]
    for r in rows:
        assert {"prefill_flops", "train_flops_per_token", "kv_cache_bytes", "params_total"} <= set(r)
        assert r == json.loads(json.dumps(cost_row(shape_for("400m", r["n_layer"]).model_config("hc"))))


def test_cli_measure_adds_latency_columns():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        cli_costs(["--grid", "tiny", "--depths", "2", "--seq-len", "16", "--measure", "--device", "cpu", "--json"])
    (row,) = json.loads(buf.getvalue())
    assert row["prefill_s"] > 0 and row["decode_tokens_per_s"] > 0
    assert row["prefill_tflops_per_s"] == pytest.approx(row["prefill_flops"] / row["prefill_s"] / 1e12)


def test_every_design_states_its_costs():
    "No silent zero: every registered design gives its FLOPs (the norm-placement designs an explicit 0.0)."
    from depthbench_nb.config import ARCHS, uses_shared_recipe

    for arch, design in ARCHS.items():
        assert design.forward_flops is not None or design.train_flops is not None, arch
        cfg = ModelConfig(arch=arch, **TINY) if uses_shared_recipe(arch) else None
        if cfg is not None:
            assert train_flops_per_token(cfg, 4) > 0 and cost_row(cfg, 4, 4)["train_flops_per_token"] > 0


def test_one_flops_per_token_for_the_budget_and_the_mfu():
    """The looped FLOP budget (`make_run_config(C=...)`) and the trainer's MFU read the cost model's count; for a looped
    model that is the looped paper's own count (arXiv 2604.21106 §3.2), so the budget's tokens are the paper's."""
    from depthbench_nb.looped import flops_per_token as looped_flops_per_token
    from depthbench_nb.looped import tokens_for_budget
    from depthbench_nb.run_params import make_run_config

    run = make_run_config("looped", preset="tiny", C=1e13, verbose=False)
    t = run.train
    paper = looped_flops_per_token(run.model, seq_len=t.seq_len)
    assert train_flops_per_token(run.model, t.seq_len) == paper
    assert t.tokens == tokens_for_budget(1e13, paper, t.seq_len * t.global_batch)
