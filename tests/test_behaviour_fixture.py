"""Behaviour is kept: what the package computes now equals the fixture recorded before the codebase was redesigned
(tests/behaviour_fixture.py says what it holds: short runs of every design and the looped model, parameter counts,
FLOPs, caches, shape grids, the looped accounting, both reports' tables), one entry per design."""

import copy
import hashlib
import json
import warnings

from behaviour_fixture import (
    FIXTURE,
    FLAT_RECORDINGS,
    RECORD_DESIGN,
    by_design,
    compare,
    compute,
    differences,
    dump,
    flat_layout,
    recordings,
)


def test_the_package_computes_what_the_fixture_recorded():
    now = by_design(compute())
    # floats within CROSS_MACHINE_RTOL of the main recording; bit for bit where this machine's numerics have their own
    # recording (made from the same code before the redesign: tests/behaviour_fixture.py explains the probe)
    for path, exact in recordings():
        diffs, notes = compare(json.loads(path.read_text()), now, exact=exact)
        how = "bit for bit" if exact else "cross-machine tolerance"
        assert not diffs, f"{len(diffs)} differences from {path.name} ({how}), e.g.\n" + "\n".join(diffs[:20])
        for note in notes:  # a design added since: its entry is not recorded yet (the recorded ones hold)
            warnings.warn(f"behaviour fixture {path.name}: {note}")
    recorded = json.loads(FIXTURE.read_text())
    runs = [run for entry in recorded["designs"].values() for run in entry.get("training", {}).values()]
    assert len(runs) == 22 and all(len(run["loss"]) == 4 for run in runs)


def test_the_keyed_recordings_hold_the_flat_recordings_unchanged():
    # the recordings were written flat before they were keyed per design: the keyed files give those bytes back
    for name, sha256 in FLAT_RECORDINGS.items():
        keyed = json.loads((FIXTURE.parent / name).read_text())
        flat = flat_layout(keyed)
        assert hashlib.sha256(dump(flat).encode()).hexdigest() == sha256, name
        assert by_design(flat) == keyed, name  # and the keyed file holds nothing else
        assert sorted(keyed["designs"]["preln"]) == ["cost_row", "depthbench_report", "shape_rows", "training"]
        assert keyed["shared"]["depthbench_report"]["depthbench_architectures"]["data"] == []  # rows in the designs


def _keyed(designs: dict, runs: int) -> dict:
    "A small keyed recording: per-design entries with report rows, and the shared run count."
    return dict(
        environment=dict(cpu_capability="X", torch="0"),
        designs={
            name: dict(
                training={name: dict(loss=[loss])}, depthbench_report=dict(t=dict(index=[i], data=[[name, loss]]))
            )
            for i, (name, loss) in enumerate(designs.items())
        },
        shared=dict(depthbench_report=dict(depthbench_run_status=dict(columns=["runs"], index=[0], data=[[runs]]))),
    )


def test_a_new_design_adds_an_entry_and_leaves_the_recorded_ones():
    recorded = _keyed(dict(a=2.0, b=3.0), runs=2)
    assert compare(recorded, copy.deepcopy(recorded), exact=True) == ([], [])
    # a design registered since: its rows and its run are new, the recorded entries hold (their rows moved down)
    now = _keyed(dict(new=1.0, a=2.0, b=3.0), runs=3)
    diffs, notes = compare(recorded, now, exact=True)
    assert diffs == []
    assert notes[0] == f"design 'new': not recorded yet: record with {RECORD_DESIGN} new"
    assert "depthbench_run_status summarises all designs and changed with new" in notes[1]
    # a recorded design that changed is a difference, new design or not
    now["designs"]["b"]["training"]["b"]["loss"] = [3.5]
    assert compare(recorded, now, exact=True)[0] == ["/designs/b/training/b/loss[0]: 3.0 recorded, 3.5 now"]
    now["designs"]["b"]["depthbench_report"]["t"]["data"] = [["b", 3.1]]
    assert "/designs/b/depthbench_report/t[0][1]: 3.0 recorded, 3.1 now" in compare(recorded, now, exact=True)[0]
    # without a new design, the shared tables are compared like everything else; a design gone is a difference
    gone = _keyed(dict(a=2.0), runs=1)
    assert compare(recorded, gone, exact=True)[0] == [
        "/designs/b: missing now",
        "/shared/depthbench_report/depthbench_run_status/data[0][0]: 2 recorded, 1 now",
    ]


def test_a_column_added_to_a_report_table_is_a_note_and_the_recorded_ones_still_compare():
    recorded = _keyed(dict(a=2.0, b=3.0), runs=2)
    recorded["shared"]["depthbench_report"]["t"] = dict(columns=["arch", "loss"], index=[], data=[])
    now = copy.deepcopy(recorded)
    now["shared"]["depthbench_report"]["t"]["columns"] = ["arch", "loss_std", "loss"]  # a spread column, new
    for name, loss in (("a", 2.0), ("b", 3.0)):
        now["designs"][name]["depthbench_report"]["t"]["data"] = [[name, 0.1, loss]]
    diffs, notes = compare(recorded, now, exact=True)
    assert diffs == [] and notes == [
        "/depthbench_report/t: column(s) added since the recording, not compared: ['loss_std']"
    ]
    now["designs"]["b"]["depthbench_report"]["t"]["data"] = [["b", 0.1, 3.1]]  # a recorded column changed
    assert compare(recorded, now, exact=True)[0] == ["/designs/b/depthbench_report/t[0][1]: 3.0 recorded, 3.1 now"]
    now["shared"]["depthbench_report"]["t"]["columns"] = ["arch", "loss_std"]  # a recorded column gone
    assert compare(recorded, now, exact=True)[0] != []


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
    def fits(phi: float, loss: float) -> dict:
        return {"designs": {"looped": {"looped_report": {"phi": [phi]}, "training": {"loss": [loss]}}}}

    assert differences(fits(0.46, 2.0), fits(0.46 * (1 + 1e-7), 2.0), exact=True) == []
    assert differences(fits(0.46, 2.0), fits(0.46 * (1 + 1e-4), 2.0), exact=True) != []
    assert differences(fits(0.46, 2.0), fits(0.46, 2.0 + 1e-12), exact=True) != []
