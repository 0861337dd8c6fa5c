"""A callback of one's own, joined by import path (`tests.test_ablations`): counts the steps it saw, carries the count
through checkpoints (`state_dict`), and writes `probe-rank<R>.json` in the run folder at every step, one file per
process, so a test can tell which processes built it and what count each one reached."""

import json

from depthbench_nb.callbacks import Callback


class StepProbe(Callback):
    def __init__(self, tag: str = "probe"):
        self.tag, self.n, self.resumed_from = tag, 0, None

    def state_dict(self):
        return dict(n=self.n)

    def load_state_dict(self, state):
        self.n = self.resumed_from = state["n"]

    def on_step_end(self, state):
        self.n += 1
        record = dict(tag=self.tag, n=self.n, step=state.step, resumed_from=self.resumed_from, world=state.dist.world)
        (state.folder / f"{self.tag}-rank{state.dist.rank}.json").write_text(json.dumps(record))
