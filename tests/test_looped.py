"""Looped LMs (specs/looped.md): accounting against the paper's numbers, the model, truncated BPTT, bad input."""
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from depthbench_nb.config import ConfigError, ModelConfig
from depthbench_nb.looped import (count_looped_params, flops_per_token, loop_layout, looped_config, looped_grid_rows,
                                  looped_params, tokens_for_budget)
from depthbench_nb.shapes import count_params

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- accounting (§5)
@pytest.mark.parametrize('r, k', [(1, 240), (2, 146), (4, 98), (8, 74)])
def test_unique_params_closed_form(r, k):
    for s in (6, 10, 34):
        d = 64 * s
        unique_layers = {1: 20, 2: 12, 4: 8, 8: 6}[r]
        p = looped_params(looped_config(s, r))
        assert p.n_unique == k * d * d + 2 * d * unique_layers          # N(r) = k d^2 + norm gains
        assert p.n_once == (0 if r == 1 else 4 * (12 * d * d + 2 * d))


@pytest.mark.parametrize('s, table6', [(10, (98.3, 59.8, 40.2, 30.3)), (34, (1136.5, 691.4, 464.1, 350.4))])
def test_table6_params(s, table6):
    assert tuple(round(count_params(looped_config(s, r)).backbone / 1e6, 1) for r in (1, 2, 4, 8)) == table6


def test_flops_and_tokens_match_the_paper():
    d, V, T = 384, 32064, 2048                                            # s = 6, r = 1, by hand
    assert flops_per_token(6, 1) == 6 * (20 * (12 * d * d + 2 * d) + d * V) + 12 * 20 * d * T
    assert round(flops_per_token(6, 1) / 1e8, 4) == 4.7505
    assert round(tokens_for_budget(4.64e17, flops_per_token(6, 1)) / 1e9, 2) == 0.98
    # looped models pay the injection: 6 r 2d^2 more than the r = 1 model at the same width
    for r in (2, 4, 8):
        assert flops_per_token(10, r) - flops_per_token(10, 1) == 6 * r * 2 * 640**2


def test_truncated_bptt_flops_eq6():
    d, V, T, r = 640, 32064, 2048, 8
    n_b, n_i, r_bwd = 12 * d * d + 2 * d, 2 * d * d, 4
    eq6 = (2 * (r - r_bwd) + 6 * r_bwd) * (2 * n_b + n_i) + 6 * 4 * n_b + 6 * d * V
    attn = 12 * 4 * d * T + (4 * (r - r_bwd) + 12 * r_bwd) * 2 * d * T
    assert flops_per_token(10, 8, truncated_bptt=True) == eq6 + attn


def test_grids():
    base = looped_grid_rows('baseline')
    assert len(base) == 116 and {r: sum(x['r'] == r for x in base) for r in (1, 2, 4, 8)} == {1: 29, 2: 29, 4: 29, 8: 29}
    assert len(looped_grid_rows('hc')) == 83
    tb = looped_grid_rows('tbptt', 'all')
    assert sorted({x['s'] for x in tb if x['C'] == 2.15e19 and x['r'] == 4}) == [18, 24, 28, 34, 40]
    assert {x['r_bwd'] for x in tb if x['r'] == 8} == {4}
    ratio = [t['tokens'] / next(b['tokens'] for b in base if (b['C'], b['s'], b['r']) == (t['C'], t['s'], t['r']))
             for t in looped_grid_rows('tbptt') if t['r'] > 1 and t['s'] in {b['s'] for b in base if b['C'] == t['C']}]
    assert 1.28 < statistics.median(ratio) < 1.35                          # "~30% more tokens" (§2)
    with pytest.raises(ConfigError, match='baseline'): looped_grid_rows('nope')


def test_shapes_cli_lists_the_looped_grid():
    p = subprocess.run([str(Path(sys.executable).parent / 'depthbench-nb'), 'shapes', '--grid', 'looped', '--variant', 'hc', '--json'],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert len(rows) == 83
    assert {'C', 's', 'r', 'd_model', 'n_once', 'n_rec', 'flops_per_token', 'tokens'} <= set(rows[0])


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize('kw, words', [
    (dict(recurrence=3), ['divide 16']),
    (dict(recurrence=4, injection='hc', truncated_bptt=True), ['full BPTT']),
    (dict(recurrence=4, injection='gated'), ['linear', 'additive', 'passthrough', 'hc']),
])
def test_bad_looped_configs(kw, words):
    with pytest.raises(ConfigError) as e:
        loop_layout(ModelConfig(arch='looped', n_layer=20, d_model=128, n_head=2, **kw))
    assert all(w in str(e.value) for w in words), str(e.value)


def test_bad_layouts():
    with pytest.raises(ConfigError, match='needs a loop'): looped_config(6, 1, injection='hc')
    with pytest.raises(ConfigError, match='n_layer'): loop_layout(ModelConfig(arch='looped', n_layer=9, d_model=128, n_head=2, recurrence=2))


# ---------------------------------------------------------------- the model (§1-3)
import importlib

import torch

from depthbench_nb.config import resolve_arch
from depthbench_nb.looped import LoopedLM, build_looped


def tiny(r=2, n_layer=8, **kw):
    return ModelConfig(arch='looped', n_layer=n_layer, d_model=64, n_head=2, vocab_size=97, max_seq_len=64, recurrence=r, **kw)


def make(cfg, seed=0, perturb=True):
    "A tiny model moved off its init (so W_inj passes gradient to the state and lanes differ)."
    torch.manual_seed(seed)
    m = build_looped(cfg)
    if perturb:
        with torch.no_grad():
            for n, p in m.named_parameters():
                if n.startswith(('inject', 'lane_')) or n.endswith('norm_recur.weight'): p.add_(0.05 * torch.randn_like(p))
    return m


CONFIGS = [tiny(1), tiny(2), tiny(4, 12), tiny(4, 12, injection='additive'), tiny(2, injection='passthrough'),
           tiny(4, 12, injection='hc'), tiny(8, 20, truncated_bptt=True), tiny(2, n_kv_head=1)]


def test_registry_builds_the_looped_model():
    mod, fn = resolve_arch('looped').impl.split(':')
    assert getattr(importlib.import_module(mod), fn) is build_looped
    assert isinstance(build_looped(tiny()), LoopedLM)


@pytest.mark.parametrize('cfg', CONFIGS, ids=lambda c: f'r{c.recurrence}-{c.injection}-tb{c.truncated_bptt}-kv{c.n_kv_head}')
def test_model_count_causality_states_and_grads(cfg):
    m = make(cfg)
    assert sum(p.numel() for p in m.parameters()) == count_looped_params(cfg).total == count_params(cfg).total
    assert m.n_blocks == cfg.n_layer and len(m.blocks) == loop_layout(cfg).n_unique
    x = torch.randint(0, 97, (2, 10))
    logits, states = m(x, return_states=True)
    assert logits.dtype == torch.float32 and logits.shape == (2, 10, 97) and logits.abs().max() <= 15
    assert len(states) == m.n_blocks + 1 and all(z.shape == (2, 10, 64) for z in states)
    x2 = x.clone(); x2[:, 6:] = (x2[:, 6:] + 1) % 97
    assert torch.allclose(m(x2)[:, :6], logits[:, :6], atol=1e-6)         # causal
    loss = torch.nn.functional.cross_entropy(logits.view(-1, 97), x.roll(-1, 1).view(-1))
    loss.backward()
    for n, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
    last = states[-1] if loop_layout(cfg).n_coda else m.norm_recur(states[-1])   # r = 1 ends with RMSNorm_recur
    assert torch.allclose(m.readout(m.n_blocks, last), logits, atol=1e-6)       # the lens at the top is the model
    with pytest.raises(ConfigError, match='state_index'): m.readout(m.n_blocks + 1, last)


def test_init_follows_the_paper():
    m = build_looped(tiny(4, 12))
    d, ffn = 64, 256
    w = m.blocks[3].attn.c_proj.weight
    assert w.abs().max() <= 3**0.5 / d**0.5 and w.abs().max() > 0.9 * 3**0.5 / d**0.5    # U(-a, a), a = sqrt(3/d)
    assert m.blocks[0].mlp.c_proj.weight.abs().max() <= 3**0.5 / ffn**0.5
    assert abs(m.wte.weight.std().item() - 1) < 0.05 and abs(m.lm_head.weight.std().item() - 1e-3) < 1e-4
    assert torch.equal(m.inject.weight, torch.cat([torch.eye(d), torch.zeros(d, d)], 1))


@pytest.mark.parametrize('r, n_layer', [(2, 8), (4, 12), (8, 20)])
def test_truncated_bptt_gradients(r, n_layer):
    full = make(tiny(r, n_layer))
    trunc = build_looped(tiny(r, n_layer, truncated_bptt=True)); trunc.load_state_dict(full.state_dict())
    x = torch.randint(0, 97, (2, 8))
    logits, states = trunc(x, return_states=True)
    assert torch.equal(logits, full(x))                                     # forward unchanged
    for z in states: z.retain_grad()
    logits.square().mean().backward()
    r_bwd = math.ceil(r / 2)
    for k, it in enumerate(trunc.iteration_of):
        g = states[k + 1].grad
        if it is None: assert g is not None and g.abs().sum() > 0           # prelude and coda always learn
        elif it < r - r_bwd: assert g is None or g.abs().sum() == 0, (k, it)
        else: assert g is not None and g.abs().sum() > 0, (k, it)
    # the shared weights' gradient differs from full BPTT's (fewer paths), the coda's does not
    logits_full = full(x); logits_full.square().mean().backward()
    shared = trunc.layout.n_prelude
    g_trunc, g_full = trunc.blocks[shared].mlp.c_fc.weight.grad, full.blocks[shared].mlp.c_fc.weight.grad
    assert (g_trunc - g_full).abs().max() > 1e-4 * g_full.abs().max()
    assert torch.allclose(trunc.blocks[-1].mlp.c_fc.weight.grad, full.blocks[-1].mlp.c_fc.weight.grad, atol=1e-6)


def test_hc_lanes_by_hand():
    "The loop hyper-connection recurrence, recomputed by hand from the model's own pieces (§3, Eq. 7)."
    m = make(tiny(2, 8, injection='hc'))
    x = torch.randint(0, 97, (1, 6))
    logits, states = m(x, return_states=True)
    e = states[2]
    from depthbench_nb.looped import rope_tables
    cos, sin = rope_tables(0, 6, 32, 1e4)
    lanes = [e, e]
    for i in range(2):
        u = m.lane_alpha[i, 0] * lanes[0] + m.lane_alpha[i, 1] * lanes[1]
        for b in (2, 3): u = m.blocks[b](u, cos, sin)
        s = m.norm_recur(u)
        lanes = [m.lane_mixing[i, j, 0] * lanes[0] + m.lane_mixing[i, j, 1] * lanes[1] + m.lane_beta[i, j] * s for j in range(2)]
    y = lanes[0] + lanes[1]
    for b in (4, 5): y = m.blocks[b](y, cos, sin)
    assert torch.allclose(m._logits(y), logits, atol=1e-5)


def test_kv_cache_decoding_matches_full_forward():
    m = make(tiny(4, 12))
    x = torch.randint(0, 97, (2, 9))
    cache = m.new_kv_cache()
    out = torch.cat([m(x[:, :4], kv_cache=cache)] + [m(x[:, t:t + 1], kv_cache=cache) for t in range(4, 9)], 1)
    assert torch.allclose(out, m(x), atol=1e-5)


def test_swap_and_skip_over_executed_layers():
    m = make(tiny(4, 12))
    x = torch.randint(0, 97, (2, 8))
    base = m(x)
    m.swap_blocks(3, 8)                       # two executions of shared layers in different iterations
    assert m.schedule[3] == 2 and m.schedule[8] == 3 and not torch.allclose(m(x), base)
    m.swap_blocks(3, 8)
    assert torch.equal(m(x), base)
    assert not torch.allclose(m(x, skip=[4]), base)
    with pytest.raises(ConfigError, match='0..11'): m(x, skip=[12])
    with pytest.raises(ConfigError, match='swap index'): m.swap_blocks(0, 99)
