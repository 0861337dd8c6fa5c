"""Completed looped run records written as the trainer writes them (params.json + result.json), for the tests that
build the looped report from records made here rather than from looped models trained for real (training the paper's
grids would take GPU-years): tests/test_looped_report.py, tests/test_reports.py and the behaviour fixture."""

from pathlib import Path
from typing import Optional

from depthbench_nb.runs import provenance, result_identity, run_dir, write_params, write_result

FIXTURE_NOTE = "test fixture: loss from the paper law"  # said in each record's provenance


def write_looped_record(run, loss: float, steps: Optional[int] = None, note: Optional[str] = FIXTURE_NOTE) -> Path:
    """A completed run record of `run` whose final and best validation loss is `loss`; by default it completed every
    planned step (the trainer's count). `note` goes into the record's provenance (None: the provenance alone)."""
    folder = run_dir(run)
    folder.mkdir(parents=True, exist_ok=True)
    write_params(folder, run)
    train = run.train
    tokens = train.tokens if train.max_steps is None else train.max_steps * train.global_batch * train.seq_len
    write_result(
        folder,
        dict(
            status="completed",
            **result_identity(run),
            steps=steps if steps is not None else tokens // (train.seq_len * train.global_batch),
            tokens=tokens,
            final_val_loss=loss,
            best_val_loss=loss,
            wall_time_s=0.0,
            train_flops=None,
            params_total=None,
            params_backbone=None,
            provenance=provenance() if note is None else dict(provenance(), note=note),
        ),
    )
    return folder
