"""Behaviour is kept: what the package computes now equals the fixture recorded before the codebase was redesigned
(tests/behaviour_fixture.py says what it holds: short runs of every design and the looped model, parameter counts,
FLOPs, caches, shape grids, the looped accounting, both reports' tables)."""

import json


from behaviour_fixture import FIXTURE, compute, differences, environment_fixture


def test_the_package_computes_what_the_fixture_recorded():
    now = compute()
    # floats within CROSS_MACHINE_RTOL of the main recording; bit for bit where this machine's numerics have their own
    # recording (made from the same code before the redesign: tests/behaviour_fixture.py explains the probe)
    references = [(FIXTURE, False)] + ([(environment_fixture(), True)] if environment_fixture().exists() else [])
    for path, exact in references:
        recorded = json.loads(path.read_text())
        diffs = differences(
            {k: v for k, v in recorded.items() if k not in ("cpu_capability", "torch")},
            {k: v for k, v in now.items() if k not in ("cpu_capability", "torch")},
            exact=exact,
        )
        assert not diffs, (
            f"{len(diffs)} differences from {path.name} ({'bit for bit' if exact else 'cross-machine tolerance'}), e.g.\n"
            + "\n".join(diffs[:20])
        )
    recorded = json.loads(FIXTURE.read_text())
    assert len(recorded["training"]) == 22 and all(len(r["loss"]) == 4 for r in recorded["training"].values())


def test_the_comparison_sees_a_change():
    a = {"x": [1.0, 2.0], "n": 3, "s": "a"}
    assert differences(a, a, exact=True) == []
    assert differences(a, {"x": [1.0, 2.0 + 1e-12], "n": 3, "s": "a"}, exact=True) == [
        "/x[1]: 2.0 recorded, 2.000000000001 now"
    ]
    assert differences(a, {"x": [1.0, 2.0 + 1e-12], "n": 3, "s": "a"}, exact=False) == []
    assert differences(a, {"x": [1.0, 2.1], "n": 4, "s": "a"}, exact=False) == [
        "/x[1]: 2.0 recorded, 2.1 now",
        "/n: 3 recorded, 4 now",
    ]
    assert differences({"loss": [2.0]}, {"loss": [2.0 * (1 + 5e-5)]}, exact=False) != []  # a loss moved by 5e-5
    assert differences({"grad_norm": [2.0]}, {"grad_norm": [2.0 * (1 + 5e-4)]}, exact=False) == []
    assert differences(a, {"x": [1.0], "n": 3}, exact=False) == ["/s: missing now", "/x: 2 items recorded, 1 now"]
    # the float64 fits of the looped report: to the cross-machine tolerance, even on the bit-for-bit path
    fit = {"looped_report": {"phi": [0.46]}, "training": {"loss": [2.0]}}
    assert (
        differences(fit, {"looped_report": {"phi": [0.46 * (1 + 1e-7)]}, "training": {"loss": [2.0]}}, exact=True) == []
    )
    assert (
        differences(fit, {"looped_report": {"phi": [0.46 * (1 + 1e-4)]}, "training": {"loss": [2.0]}}, exact=True) != []
    )
    assert differences(fit, {"looped_report": {"phi": [0.46]}, "training": {"loss": [2.0 + 1e-12]}}, exact=True) != []
