"""Behaviour is kept: what the package computes now equals the fixture recorded before the codebase was redesigned
(tests/behaviour_fixture.py says what it holds: short runs of every design and the looped model, parameter counts,
FLOPs, caches, shape grids, the looped accounting, both reports' tables)."""
import json

import torch

from behaviour_fixture import FIXTURE, compute, differences


def test_the_package_computes_what_the_fixture_recorded():
    recorded = json.loads(FIXTURE.read_text())
    now = compute()
    # bit for bit on a CPU of the recorded vector capability; elsewhere floats within 1e-6 relative
    exact = recorded['cpu_capability'] == torch.backends.cpu.get_cpu_capability() and recorded['torch'] == torch.__version__
    diffs = differences({k: v for k, v in recorded.items() if k not in ('cpu_capability', 'torch')},
                        {k: v for k, v in now.items() if k not in ('cpu_capability', 'torch')}, exact=exact)
    assert not diffs, f'{len(diffs)} differences from the recorded behaviour, e.g.\n' + '\n'.join(diffs[:20])
    assert len(recorded['training']) == 22 and all(len(r['loss']) == 4 for r in recorded['training'].values())


def test_the_comparison_sees_a_change():
    a = {'x': [1.0, 2.0], 'n': 3, 's': 'a'}
    assert differences(a, a, exact=True) == []
    assert differences(a, {'x': [1.0, 2.0 + 1e-12], 'n': 3, 's': 'a'}, exact=True) == ['/x[1]: 2.0 recorded, 2.000000000001 now']
    assert differences(a, {'x': [1.0, 2.0 + 1e-12], 'n': 3, 's': 'a'}, exact=False) == []
    assert differences(a, {'x': [1.0, 2.1], 'n': 4, 's': 'a'}, exact=False) == ['/x[1]: 2.0 recorded, 2.1 now', '/n: 3 recorded, 4 now']
    assert differences(a, {'x': [1.0], 'n': 3}, exact=False) == ['/s: missing now', '/x: 2 items recorded, 1 now']
