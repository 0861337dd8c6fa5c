"""The model zoo: every design through the shared check suite, parameter counts at the paper's shapes, independent
reference implementations of the backbone and of the HC/mHC/AttnRes/MoDA equations, the analysis hooks, bad input."""

import dataclasses
import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from depthbench_nb.checks import check_design, failures, _tiny_config
from depthbench_nb.config import (
    ARCHS,
    ConfigError,
    Design,
    DesignOptions,
    ModelConfig,
    _config_hash,
    paper_designs,
    recipe_designs,
    register_design,
    unregister_design,
)
from depthbench_nb.layers import KVCache
from depthbench_nb.model import (
    PreLNBlock,
    ResidualTransformer,
    _block_attnres_groups,
    build_model,
    n_params,
    no_extra_flops,
    _no_extra_params,
    _no_init_invariants,
)
from depthbench_nb.shapes import count_params, grid_shapes, shape_for

DESIGNS = recipe_designs()  # every registered design on DepthBench's recipe: registering one tests it
VARIANTS = [
    dict(arch="hc", hc_update="unmixed"),
    dict(arch="hc", hc_tanh=False),
    dict(arch="mhc", mhc_backend="native"),
    dict(arch="mhc", mhc_backend="static"),
    dict(arch="block_attnres", attnres_block_size=3),
    dict(arch="block_attnres", attnres_num_blocks=3),
    dict(arch="moda", moda_ffn_kv=False),
    dict(arch="preln", n_kv_head=4),
    dict(arch="moda", n_kv_head=1),
    dict(arch="keel", n_layer=2),
    dict(arch="hc", hc_streams=2),
    dict(arch="mhc", hc_streams=3),
    dict(arch="mhc", sinkhorn_iters=5),
]
ROOT = Path(__file__).resolve().parent.parent


def _id(kw):
    return "-".join(f"{v}" for v in kw.values())


@pytest.mark.parametrize("kw", [dict(arch=a) for a in DESIGNS] + VARIANTS, ids=_id)
def test_check_suite(kw):
    report = check_design(_tiny_config(**kw))
    assert not failures(report), failures(report)


# ---- parameter counts -------------------------------------------------------------------------------------------
def test_acceptance_counts_at_400m_L24():
    s = shape_for("400m", 24)
    got = {a: n_params(build_model(s.model_config(a), device="meta")) for a in DESIGNS}
    for a in DESIGNS:
        assert got[a] == count_params(s.model_config(a)).total, a
    d, n_sub = 1024, 48
    assert round(got["preln"] / 1e6) == 405
    assert (
        abs(got["moda"] / 1e6 - 454) < 1
    )  # official MoDA (pretrain/OLMo-core/src/olmo_core/nn/moda.py): 405M -> 454M, +48.2M
    assert abs((got["moda"] - got["preln"]) / 1e6 - 48.2) < 0.1
    assert got["mhc"] - got["preln"] == n_sub * (96 * d + 27)
    assert got["hc"] - got["preln"] == n_sub * (6 * d + 26)
    assert abs((got["mhc"] - got["preln"]) / 1e6 - 4.7) < 0.05 and abs((got["hc"] - got["preln"]) / 1e6 - 0.30) < 0.01


@pytest.mark.parametrize("grid", ["400m", "1.6b"])
def test_closed_form_equals_instantiated_on_paper_grids(grid):
    for s in grid_shapes(grid):
        for kw in [dict(arch=a) for a in DESIGNS] + [
            v for v in VARIANTS if set(v) <= {"arch", "hc_update", "mhc_backend", "moda_ffn_kv"}
        ]:
            cfg = s.model_config(**kw)
            assert n_params(build_model(cfg, device="meta")) == count_params(cfg).total, (s.n_layer, kw)


def test_moda_extra_at_L16_and_L70():  # official MoDA (nn/moda.py): +44.4M at L16, +56.5M at L70
    for L, want in ((16, 44.4), (70, 56.5)):
        s = shape_for("400m", L)
        extra = n_params(build_model(s.model_config("moda"), device="meta")) - n_params(
            build_model(s.model_config("preln"), device="meta")
        )
        assert abs(extra / 1e6 - want) < 0.1, (L, extra)


def test_shapes_cli_reports_the_real_count():
    p = subprocess.run(
        [
            str(Path(sys.executable).parent / "depthbench-nb"),
            "shapes",
            "--grid",
            "400m",
            "--arch",
            "mhc",
            "--depths",
            "24",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    rows = rows["rows"] if isinstance(rows, dict) and "rows" in rows else rows
    assert rows[0]["params_total"] == n_params(build_model(shape_for("400m", 24).model_config("mhc"), device="meta"))


# ---- an independent Pre-LN reference -------------------------------------------------------------------------------
def _rope_complex(x, theta=1e4):
    "RoPE via complex numbers: channel i pairs with i + hd/2 (the rotate-half layout). x [B, T, H, hd]."
    B, T, H, hd = x.shape
    z = torch.complex(x[..., : hd // 2].double(), x[..., hd // 2 :].double())
    freq = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    z = (
        z
        * torch.polar(
            torch.ones(T, hd // 2, dtype=torch.float64), torch.arange(T, dtype=torch.float64)[:, None] * freq
        )[None, :, None]
    )
    return torch.cat([z.real, z.imag], -1)


def _naive_preln(model, idx):
    cfg = model.config
    H, Hk, hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim

    def rms(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.norm_eps) * w.double()

    def W(lin):
        return lin.weight.double()

    x = model.tok_emb.weight.double()[idx]
    B, T, _ = x.shape
    for blk in model.blocks:
        u = rms(x, blk.attn_norm.weight)
        q = _rope_complex((u @ W(blk.attn.wq).T).view(B, T, H, hd))
        k = _rope_complex((u @ W(blk.attn.wk).T).view(B, T, Hk, hd))
        v = (u @ W(blk.attn.wv).T).view(B, T, Hk, hd)
        out = torch.zeros(B, T, H, hd, dtype=torch.float64)
        for h in range(H):
            g = h // (H // Hk)
            for t in range(T):
                s = (k[:, : t + 1, g] * q[:, t : t + 1, h]).sum(-1) / math.sqrt(hd)  # [B, t+1]
                out[:, t, h] = (torch.softmax(s, -1)[..., None] * v[:, : t + 1, g]).sum(1)
        x = x + out.reshape(B, T, H * hd) @ W(blk.attn.wo).T
        u = rms(x, blk.ffn_norm.weight)
        x = x + (F.silu(u @ W(blk.ffn.w1).T) * (u @ W(blk.ffn.w3).T)) @ W(blk.ffn.w2).T
    return rms(x, model.final_norm.weight) @ W(model.lm_head).T


@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_preln_matches_a_naive_reference(n_kv_head):
    model = build_model(_tiny_config("preln", n_kv_head=n_kv_head), seed=3)
    idx = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        got = model(idx).double()
    assert torch.allclose(got, _naive_preln(model, idx), atol=1e-4)


def test_init_is_the_spec_init():
    m = build_model(ModelConfig(arch="preln", n_layer=2, d_model=128, n_head=4, vocab_size=512))
    w = m.tok_emb.weight
    assert w.abs().max() <= 0.06 and abs(w.std().item() - 0.02 * 0.9866) < 5e-4 and abs(w.mean().item()) < 5e-4
    assert torch.equal(build_model(m.config, seed=0).lm_head.weight, m.lm_head.weight)
    assert not torch.equal(build_model(m.config, seed=1).lm_head.weight, m.lm_head.weight)


# ---- residual designs: equations against hand-written forwards
# ----------------------------------------------------------
def _block_io(model, idx, b):
    "(input, output) of block b."
    with torch.no_grad():
        _, states = model(idx, return_states=True)
    return states[b], states[b + 1]


def _attn(blk, u):
    return blk.attn(u)[0]


@pytest.mark.parametrize("arch", ["periln", "lns", "deepnorm", "keel"])
def test_block_equations(arch):
    model = build_model(_tiny_config(arch), seed=1)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)  # non-trivial norm gains
    idx = torch.randint(0, 64, (2, 6))
    L = model.n_blocks
    for b in range(L):
        x, y = _block_io(model, idx, b)
        blk = model.blocks[b]
        with torch.no_grad():
            if arch == "periln":
                h = x + blk.attn_out_norm(_attn(blk, blk.attn_norm(x)))
                want = h + blk.ffn_out_norm(blk.ffn(blk.ffn_norm(h)))
            elif arch == "lns":
                s = 1 / math.sqrt(b + 1)
                h = x + _attn(blk, blk.attn_norm(x) * s)
                want = h + blk.ffn(blk.ffn_norm(h) * s)
            elif arch == "deepnorm":
                a = (2 * L) ** 0.25

                def ln(m, t):
                    return F.layer_norm(t, t.shape[-1:], m.weight, None, 1e-6)

                h = ln(blk.attn_norm, a * x + _attn(blk, x))
                want = ln(blk.ffn_norm, a * h + blk.ffn(h))
            else:
                a = 2 * L
                if b == 0:
                    h = x + _attn(blk, blk.attn_norm(x))
                    want = blk.ffn_out_norm(h + blk.ffn(blk.ffn_norm(h)))
                else:
                    h = blk.attn_out_norm(a * x + _attn(blk, blk.attn_norm(x)))
                    want = blk.ffn_out_norm(a * h + blk.ffn(blk.ffn_norm(h)))
        assert torch.allclose(y, want, atol=1e-5), (arch, b)


# DeepNormTransformerBlock, pretrain/OLMo-core/src/olmo_core/nn/transformer/block.py
def test_deepnorm_values_of_the_spec():
    for L, a, b in ((16, 2.378, 0.297), (24, 2.632, 0.269), (70, 3.440, 0.206)):
        m = build_model(ModelConfig(arch="deepnorm", n_layer=L, d_model=32, n_head=4, vocab_size=64), device="meta")
        assert abs(m.blocks[0].alpha - a) < 1e-3 and abs((8 * L) ** -0.25 - b) < 1e-3


def test_keel_alpha_is_2L():
    m = build_model(ModelConfig(arch="keel", n_layer=24, d_model=32, n_head=4, vocab_size=64), device="meta")
    assert m.blocks[0].alpha == 1.0 and {blk.alpha for blk in m.blocks[1:]} == {48.0}


# ---- MoDA: depth attention against an explicit per-token computation
# --------------------------------------------------
def test_moda_depth_attention_reference():
    model = build_model(_tiny_config("moda", n_layer=3, n_kv_head=4), seed=2)
    cfg, idx = model.config, torch.randint(0, 64, (1, 5))
    H, hd = cfg.n_head, cfg.head_dim
    slots = []  # (k before RoPE, v) per token: [T, H, hd]
    with torch.no_grad():
        _, states = model(idx, return_states=True)
        for b, blk in enumerate(model.blocks):
            x = states[b][0]  # [T, d]
            u = blk.attn_norm(x)
            q, k, v = blk.attn.wq(u).view(-1, H, hd), blk.attn.wk(u).view(-1, H, hd), blk.attn.wv(u).view(-1, H, hd)
            qr, kr = _rope_complex(q[None]).float()[0], _rope_complex(k[None]).float()[0]
            out = torch.zeros_like(q)
            for t in range(q.shape[0]):
                for h in range(H):
                    keys = [kr[s, h] for s in range(t + 1)] + [sl[0][t, h] for sl in slots]
                    vals = [v[s, h] for s in range(t + 1)] + [sl[1][t, h] for sl in slots]
                    p = torch.softmax(torch.stack([qr[t, h] @ kk for kk in keys]) / math.sqrt(hd), 0)
                    out[t, h] = sum(pi * vv for pi, vv in zip(p, vals))
            hmid = x + blk.attn.wo(out.reshape(-1, H * hd))
            slots.append((k, v))
            uf = blk.ffn_norm(hmid)
            if b < cfg.n_layer - 1:
                kv = blk.depth_kv(uf).view(-1, 2, H, hd)
                slots.append((kv[:, 0], kv[:, 1]))
            assert torch.allclose(hmid + blk.ffn(uf), states[b + 1][0], atol=1e-5), b


# ---- HC / mHC: the connector equations per token
# ------------------------------------------------------------------------
def _perturb(model, scale=0.3):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if (
                "_hc." in name
                and "static" not in name
                and not name.endswith((".b", "_logits", ".b_pre", ".b_post", ".b_res"))
            ):
                p.add_(torch.randn_like(p) * scale)


def test_hc_mixed_and_unmixed_updates():
    for update in ("mixed", "unmixed"):
        model = build_model(_tiny_config("hc", hc_update=update, n_layer=2), seed=4)
        _perturb(model)
        idx = torch.randint(0, 64, (2, 5))
        blk, n = model.blocks[0], 4
        with torch.no_grad():
            _, states = model(idx, return_states=True)
            Hs = states[0].unflatten(-1, (n, -1))
            for conn, branch in (
                (blk.attn_hc, lambda u: _attn(blk, blk.attn_norm(u))),
                (blk.ffn_hc, lambda u: blk.ffn(blk.ffn_norm(u))),
            ):
                Hn = Hs / torch.sqrt((Hs * Hs).mean(-1, keepdim=True) + 1e-8)
                A = conn.static_alpha + conn.dynamic_alpha_scale * torch.tanh(Hn @ conn.dynamic_alpha_fn)  # [B,T,n,n+1]
                beta = conn.static_beta + conn.dynamic_beta_scale * torch.tanh(Hn @ conn.dynamic_beta_fn)  # [B,T,n]
                C = torch.einsum("btsu,btsd->btud", A, Hs)  # C_u = Σ_s A[s,u] H_s
                Fo = branch(C[:, :, 0])
                Hs = (C[:, :, 1:] if update == "mixed" else Hs) + beta[..., None] * Fo[:, :, None]
            assert torch.allclose(Hs.flatten(-2), states[1], atol=1e-5), update


def _sinkhorn_liger(logits, iters):
    m = torch.softmax(logits, -1) + 1e-6
    m = m / (m.sum(-2, keepdim=True) + 1e-6)
    for _ in range(iters - 1):
        m = m / (m.sum(-1, keepdim=True) + 1e-6)
        m = m / (m.sum(-2, keepdim=True) + 1e-6)
    return m


def test_mhc_liger_update_and_mean_readout():
    model = build_model(_tiny_config("mhc", n_layer=2), seed=5)
    _perturb(model, 0.05)
    idx = torch.randint(0, 64, (2, 5))
    blk, n = model.blocks[0], 4
    with torch.no_grad():
        logits, states = model(idx, return_states=True)
        X = states[0].unflatten(-1, (n, -1))
        for conn, branch in (
            (blk.attn_hc, lambda u: _attn(blk, blk.attn_norm(u))),
            (blk.ffn_hc, lambda u: blk.ffn(blk.ffn_norm(u))),
        ):
            x = X.flatten(-2)
            m = (x @ conn.phi) / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)
            pre = torch.sigmoid(conn.alpha_pre * m[..., :n] + conn.b[:n])
            post = 2 * torch.sigmoid(conn.alpha_post * m[..., n : 2 * n] + conn.b[n : 2 * n])
            res = _sinkhorn_liger((conn.alpha_res * m[..., 2 * n :] + conn.b[2 * n :]).view(*m.shape[:-1], n, n), 20)
            X = res @ X + post[..., None] * branch((pre[..., None] * X).sum(-2))[..., None, :]
        assert torch.allclose(X.flatten(-2), states[1], atol=1e-5)
        Xl = states[-1].unflatten(-1, (n, -1))
        assert torch.allclose(model.lm_head(model.final_norm(Xl.mean(-2))), logits, atol=1e-5)


def test_hc_readout_is_per_stream_norm_then_sum():
    model = build_model(_tiny_config("hc"), seed=6)
    _perturb(model)
    idx = torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        logits, states = model(idx, return_states=True)
        H = states[-1].unflatten(-1, (4, -1))
        assert torch.allclose(logits, model.lm_head(model.final_norm(H).sum(-2)), atol=1e-5)
        # the logit lens follows the analysis code instead: N_f(Σ H_i) (the official analysis/depth_probes.py)
        assert torch.allclose(
            model.readout(model.n_blocks, states[-1]), model.lm_head(model.final_norm(H.sum(-2))), atol=1e-5
        )


def test_mhc_gap8_values_and_static_quarter_write():
    m = build_model(_tiny_config("mhc"))
    M = m.mixing_matrices(torch.randint(0, 64, (1, 3)))[0, 0, 0]
    assert (
        abs(M[0, 0].item() - 0.998995) < 1e-5 and abs(M[0, 1].item() - 0.000335) < 1e-5
    )  # official mHC init, nn/hyper_connections.py (the +1e-6 of each normalization shifts the 6th digit)
    s = build_model(_tiny_config("mhc", mhc_backend="static"))
    read, mix, write = s.blocks[0].attn_hc(torch.zeros(1, 1, 4, 32))
    assert torch.allclose(write, torch.full_like(write, 0.25)) and read.argmax().item() == 0
    assert s.no_weight_decay_names() == {n for n, _ in s.named_parameters() if n.endswith("_logits")}


def test_hc_weight_decay_exclusions():
    m = build_model(_tiny_config("hc"))
    names = m.no_weight_decay_names()
    assert len(names) == 2 * 2 * m.n_blocks and all(
        n.rsplit(".", 1)[-1] in ("static_alpha", "static_beta") for n in names
    )
    assert build_model(_tiny_config("preln")).no_weight_decay_names() == set()
    nat = build_model(_tiny_config("mhc", mhc_backend="native")).no_weight_decay_names()
    assert {n.rsplit(".", 1)[-1] for n in nat} == {"b_pre", "b_post", "b_res"}


# ---- AttnRes
# ------------------------------------------------------------------------------------------------------------
def _naive_attnres(model, idx):
    """Full/Block AttnRes written from the official AttnResTransformerBlock (nn/transformer/block.py,
    kernels/attnres.py) with explicit source lists."""
    eps = 1e-5

    def nrm(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w

    def mix(srcs, mixer, w):
        V = torch.stack(srcs)  # [S, B, T, d]
        logit = (nrm(V, mixer.key_weight) * mixer.query).sum(-1)
        p = torch.softmax(logit, 0)
        return nrm((p[..., None] * V).sum(0), w)

    sizes = model.group_sizes
    starts = {sum(sizes[:g]) for g in range(len(sizes))}
    e = model.tok_emb(idx)
    sources, partial = [], e
    for b, blk in enumerate(model.blocks):
        for k, (mixer, norm, f) in enumerate(
            (
                (getattr(blk, "attn_mix", None), blk.attn_norm, lambda u: _attn(blk, u)),
                (blk.ffn_mix, blk.ffn_norm, blk.ffn),
            )
        ):
            sub = 2 * b + k
            if sub in starts and partial is not None:
                sources.append(partial)
                partial = None
            u = norm(e) if sub == 0 else mix(sources + ([partial] if partial is not None else []), mixer, norm.weight)
            out = f(u)
            partial = out if partial is None else partial + out
    return model.lm_head(mix(sources + [partial], model.final_mix, model.final_norm.weight))


@pytest.mark.parametrize(
    "kw",
    [
        dict(arch="attnres"),
        dict(arch="block_attnres", attnres_block_size=3),
        dict(arch="block_attnres", n_layer=5, attnres_num_blocks=4),
    ],
    ids=_id,
)
def test_attnres_matches_naive(kw):
    model = build_model(_tiny_config(**kw), seed=7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "mix." in name:
                p.normal_(0, 1.0)  # non-uniform depth weights
        idx = torch.randint(0, 64, (2, 5))
        assert torch.allclose(model(idx), _naive_attnres(model, idx), atol=1e-5)


def test_block_attnres_group_sizes_of_the_paper():
    for L, size in ((16, 4), (20, 5), (24, 6), (28, 7), (32, 8)):
        assert _block_attnres_groups(ModelConfig(arch="block_attnres", n_layer=L)) == [size] * 8
    assert _block_attnres_groups(ModelConfig(arch="block_attnres", n_layer=30)) == [8, 8, 8, 8, 7, 7, 7, 7]
    assert _block_attnres_groups(ModelConfig(arch="block_attnres", n_layer=24, attnres_block_size=5)) == [5] * 9 + [3]


def test_attnres_states_and_readout():
    model = build_model(_tiny_config("block_attnres", attnres_block_size=4), seed=8)  # groups of 2 blocks
    idx = torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        logits, states = model(idx, return_states=True)
    assert len(states) == 5 and torch.equal(states[0], model.tok_emb(idx))
    assert torch.allclose(model.readout(4, states[-1]), logits, atol=1e-5)
    assert len(model.depth_mix_weights(idx)) == 9


# ---- analysis hooks
# ----------------------------------------------------------------------------------------------------
def test_swap_rules():
    lns = build_model(_tiny_config("lns"))
    lns.swap_blocks(0, 3)
    assert [b.ln_scale for b in lns.blocks] == [
        0.5,
        1 / math.sqrt(2),
        1 / math.sqrt(3),
        1.0,
    ]  # travels with the weights
    keel = build_model(_tiny_config("keel"))
    n_pa = keel.blocks[2].attn_out_norm.weight
    with torch.no_grad():
        n_pa.fill_(3.0)
    keel.swap_blocks(0, 2)
    assert torch.all(keel.blocks[2].attn_out_norm.weight == 3.0)  # block 0 has no N_pa: it stays put
    moda = build_model(_tiny_config("moda"))
    w = moda.blocks[1].depth_kv.weight.clone()
    moda.swap_blocks(1, 3)
    assert torch.equal(moda.blocks[1].depth_kv.weight, w) and not hasattr(moda.blocks[3], "depth_kv")
    ar = build_model(_tiny_config("attnres"))
    with torch.no_grad():
        for i, blk in enumerate(ar.blocks[1:], 1):
            blk.attn_mix.query.fill_(i)
        for i, blk in enumerate(ar.blocks):
            blk.ffn_mix.query.fill_(10 + i)
        ar.final_mix.query.fill_(99)
    ar.swap_blocks(1, 3)  # block 1's right boundary = block 2's attention mixer; block 3's = the final mixer

    def q(m):
        return m.query[0].item()

    assert [q(b.attn_mix) for b in ar.blocks[1:]] == [1, 99, 3] and q(ar.final_mix) == 2
    assert [q(b.ffn_mix) for b in ar.blocks] == [10, 13, 12, 11]
    ar.swap_blocks(
        0, 2
    )  # block 0 has no input mixer (block.py): its core and its right boundary (block 1's mixer) move
    assert [q(b.attn_mix) for b in ar.blocks[1:]] == [3, 99, 1] and not hasattr(ar.blocks[0], "attn_mix")


def test_hc_swap_moves_connectors():
    m = build_model(_tiny_config("hc"))
    m.swap_blocks(0, 1)
    assert (
        m.blocks[1].attn_hc.static_alpha[0, 0] == 1 and m.blocks[0].attn_hc.static_alpha[2, 0] == 1
    )  # one-hot read travels


def test_moda_skip_leaves_zero_slots():
    model = build_model(_tiny_config("moda"))
    idx = torch.randint(0, 64, (1, 4))
    seen = []
    h = model.blocks[2].attn.register_forward_hook(lambda m, a, kw, o: seen.append(dict(kw)), with_kwargs=True)
    for mixing in ("reference", "fused"):
        model.mixing = mixing
        with torch.no_grad():
            model(idx, skip=[1])
    h.remove()
    dk = seen[0]["depth_k"]  # reference: [B, T, 4, H_kv, hd], slots 0..3 stacked
    assert dk.shape[2] == 4 and torch.all(dk[:, :, 2:] == 0) and dk[:, :, :2].abs().sum() > 0
    slots = seen[1]["depth_slots"]  # fused: the block reads the first 4 slots of the stores in place
    assert seen[1]["n_depth"] == 4
    for store in (slots.keys, slots.values):  # [2L, hd, N]: the skipped block's slots 2, 3 are zeros
        assert torch.all(store.values[2:4] == 0) and store.values[:2].abs().sum() > 0


def test_generation_with_cache_equals_without():
    for arch in DESIGNS:
        model = build_model(_tiny_config(arch))
        idx = torch.randint(0, 64, (1, 3))
        seq, cache, nxt = idx, KVCache(), idx
        with torch.no_grad():
            for _ in range(5):
                plain = model(seq)[:, -1].argmax(-1, keepdim=True)
                cached = model(nxt, kv_cache=cache)[:, -1].argmax(-1, keepdim=True)
                assert torch.equal(plain, cached), arch
                seq, nxt = torch.cat([seq, plain], 1), plain


# ---- bad input
# ---------------------------------------------------------------------------------------------------------
def test_bad_input_errors():
    with pytest.raises(ConfigError, match="unknown architecture.*preln"):
        ModelConfig(arch="resnet")
    with pytest.raises(ConfigError, match="does not apply"):
        ModelConfig(arch="hc", attnres_block_size=4)
    with pytest.raises(ConfigError, match="does not apply"):
        ModelConfig(arch="preln", moda_ffn_kv=True)
    with pytest.raises(ConfigError, match="multiple of n_kv_head"):
        ModelConfig(n_head=4, n_kv_head=3, d_model=32)
    with pytest.raises(ConfigError, match="ModelConfig"):
        build_model({"arch": "preln"})
    m = build_model(_tiny_config("hc"))
    with pytest.raises(ConfigError, match="out of range"):
        m(torch.zeros(1, 4, dtype=torch.long), skip=[4])
    with pytest.raises(ConfigError, match="max_seq_len"):
        m(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ConfigError, match="integer tensor"):
        m(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ConfigError, match="attnres"):
        m.depth_mix_weights(torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ConfigError, match="out of range"):
        m.swap_blocks(-1, 2)


@pytest.mark.parametrize("kw", [dict(arch=a) for a in DESIGNS] + VARIANTS[:4], ids=_id)
def test_bf16_pure_and_autocast(kw):
    """The GPU recipe runs bf16 autocast (and optionally pure bf16 weights): both must run forward, backward and the
    cache."""
    model = build_model(_tiny_config(**kw))
    idx = torch.randint(0, 64, (2, 9))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1).float(), idx[:, 1:].flatten())
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model = model.to(torch.bfloat16)
    cache = KVCache()
    with torch.no_grad():
        full = model(idx)
        step = torch.cat([model(idx[:, :5], kv_cache=cache), model(idx[:, 5:], kv_cache=cache)], 1)
    assert (
        full.dtype == torch.bfloat16 and torch.isfinite(full).all() and (full.float() - step.float()).abs().max() < 0.1
    )


# ---- the registry
# ------------------------------------------------------------------------------------------------------
def test_the_registry_holds_the_papers_designs_and_refuses_incomplete_ones():
    assert len(paper_designs()) == 10 and set(paper_designs()) <= set(DESIGNS)  # DepthBench's architecture table
    assert paper_designs("looped") == ["looped"]
    with pytest.raises(
        ConfigError, match=r"design 'half' is incomplete: it needs extra_params \(or count_params\), forward_flops"
    ):
        register_design(Design("half", "residual", "a block and nothing else", build=ARCHS["preln"].build))
    with pytest.raises(ConfigError, match="already registered"):
        register_design(ARCHS["preln"])
    assert "half" not in ARCHS


def test_a_miscounted_design_fails_at_build_before_training():
    class Extra(PreLNBlock):
        def __init__(self, cfg, index):
            super().__init__(cfg, index)
            self.gate = torch.nn.Parameter(torch.ones(()))

    def build_extra(cfg):
        return ResidualTransformer(cfg, Extra)

    register_design(
        Design(
            "extra",
            "residual",
            "Pre-LN with an uncounted gate",
            build=build_extra,
            extra_params=_no_extra_params,
            forward_flops=no_extra_flops,
            check_init=_no_init_invariants,
            metrics=(),
            importer="a test",
        )
    )
    try:
        with pytest.raises(ConfigError, match=r"'extra' builds .* but its closed form counts"):
            build_model(_tiny_config("extra"))
        with pytest.raises(ConfigError, match="closed form"):
            build_model(_tiny_config("extra"), device="meta")
    finally:
        unregister_design("extra")
    assert "extra" not in ARCHS


def test_family_of_reads_the_registry():
    from depthbench_nb.config import family_of

    assert [family_of(a) for a in ("sandwich", "hc", "block_attnres", "looped", "no_such_design")] == [
        "residual",
        "multistream",
        "attnres",
        "looped",
        None,
    ]


@dataclass(frozen=True)
class _GateOptions(DesignOptions):
    gate_start: float = field(default=1.0, metadata={"help": "a positive number: where the gates start"})

    def validate(self):
        if not self.gate_start > 0:
            raise ConfigError(f"gate_start must be > 0, got {self.gate_start}")


class _GateBlock(PreLNBlock):
    "Pre-LN with a learned gate on the FFN branch, started at the design's option."

    def __init__(self, cfg, index):
        super().__init__(cfg, index)
        self.gate = torch.nn.Parameter(torch.empty(()))
        self.start = cfg.gate_start

    def forward(self, x, ctx):
        h = x + self.attend(self.attn_norm(x), ctx)[0]
        return h + self.gate * self.ffn(self.ffn_norm(h))

    @torch.no_grad()
    def init_design(self, generator=None):
        self.gate.fill_(self.start)


def _gate_init(model, idx, atol):
    starts = {float(b.gate.detach()) for b in model.blocks}
    return None if starts == {model.config.gate_start} else f"gates start at {starts}"


def test_a_design_declares_its_own_options():
    "Options in the design's own dataclass: defaults, rules, records and hashes, with no edit of ModelConfig."
    before = _config_hash(_tiny_config("preln"))
    register_design(
        Design(
            "gate_opt",
            "residual",
            "Pre-LN with a gated FFN branch",
            build=lambda cfg: ResidualTransformer(cfg, _GateBlock),
            extra_params=lambda cfg: (cfg.n_layer, 0),
            forward_flops=no_extra_flops,
            check_init=_gate_init,
            metrics=(),
            importer="a test",
            options=_GateOptions,
        )
    )
    try:
        assert _tiny_config("gate_opt").gate_start == 1.0  # the default, filled in and recorded
        cfg = _tiny_config("gate_opt", gate_start=0.5)
        assert cfg.to_dict()["gate_start"] == 0.5 and "options" not in cfg.to_dict()
        assert ModelConfig.from_json(cfg.to_json()) == cfg and cfg.replace(gate_start=0.25).gate_start == 0.25
        assert _config_hash(cfg) != _config_hash(_tiny_config("gate_opt"))
        assert not failures(check_design(cfg))
        with pytest.raises(ConfigError, match=r"gate_start=0.5 does not apply to arch 'preln' \(it applies to: gate"):
            _tiny_config("preln", gate_start=0.5)
        with pytest.raises(ConfigError, match="gate_opt options: gate_start must be > 0"):
            _tiny_config("gate_opt", gate_start=-1.0)
        with pytest.raises(ConfigError, match="gate_start must be float"):
            _tiny_config("gate_opt", gate_start="big")
    finally:
        unregister_design("gate_opt")
    assert _config_hash(_tiny_config("preln")) == before and "options" not in _tiny_config("preln").to_dict()
    loose = dataclasses.replace(ARCHS["preln"], name="loose_options", paper=None, options=("gate_start",))
    with pytest.raises(ConfigError, match="loose_options: options must be a DesignOptions dataclass"):
        register_design(loose)
    clashing = dataclasses.make_dataclass("Clash", [("d_model", int, 8)], bases=(DesignOptions,), frozen=True)
    with pytest.raises(ConfigError, match=r"option names \['d_model'\] are ModelConfig fields"):
        register_design(dataclasses.replace(loose, options=clashing))
    assert "loose_options" not in ARCHS


def test_the_manual_design_with_an_option_runs_as_written():
    """The manual's "Adding a residual design" example (nbs/manual/adding_a_design.qmd), executed as written: the
    design registers, passes the shared checks with its option, and the train command offers the option with no edit
    of depthbench-nb."""
    from depthbench_nb.trainer import train_parser

    page = Path(__file__).resolve().parent.parent / "nbs" / "manual" / "adding_a_design.qmd"
    section = page.read_text().split("## A design with an option", 1)[1].split("\n## ", 1)[0]
    example = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    try:
        exec(compile(example, str(page), "exec"), {})
        assert not failures(check_design(_tiny_config("gated", gate_start=0.5)))
        model = build_model(_tiny_config("gated", gate_start=0.5))
        assert all(b.gate.item() == 0.5 for b in model.blocks)  # the one init entry point used the option
        assert "--gate-start" in train_parser().format_help()
        with pytest.raises(ConfigError, match="gate_start=0.0 is invalid: must be a positive number"):
            _tiny_config("gated", gate_start=0.0)
    finally:
        unregister_design("gated")
