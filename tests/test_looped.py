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
