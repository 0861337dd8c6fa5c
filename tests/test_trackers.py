"""Trackers for real: a tiny run trained through the CLI with TensorBoard and W&B (offline) writes event files whose
scalars (loss, lr, grad norm, tokens/s) read back equal to the run's own metrics.jsonl; a missing tracker package is
a clear error naming the extra."""

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from depthbench_nb.config import ConfigError

SCALARS = ("loss", "lr", "grad_norm", "tokens_per_s")
BIN = Path(sys.executable).parent


def read_wandb_history(path: Path) -> list[dict]:
    """The history rows of a W&B offline run file (`run-<id>.wandb`): a 7-byte header (':W&B', magic, version), then the
    LevelDB log format (32 KiB blocks of records: crc32, length, type FULL/FIRST/MIDDLE/LAST) of `Record` protobufs."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, buf, rows = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B", data[:8]
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:
            pos += room
            continue  # a block's tail too short for a header is padding
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += room
            continue  # zero padding to the end of the block
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            if rec.WhichOneof("record_type") == "history":
                rows.append({it.key or "/".join(it.nested_key): json.loads(it.value_json) for it in rec.history.item})
            buf = b""
    return rows


def read_tensorboard(folder: Path) -> dict[str, dict[int, float]]:
    "Scalars of every event file under `folder`: tag -> {step: value}."
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict = {}
    for f in folder.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(f))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return out


def test_tensorboard_and_wandb_offline_record_the_run(tiny_data, tmp_path):
    pytest.importorskip("tensorboard", reason="the 'tensorboard' extra")
    pytest.importorskip("wandb", reason="the 'wandb' extra")
    runs = tmp_path / "runs"
    env = dict(
        os.environ,
        DEPTHBENCH_RUNS=str(runs),
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_DISABLE_GIT="true",
        WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"),
        WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"),
    )
    cmd = [
        str(BIN / "depthbench-nb"),
        "train",
        "--arch",
        "hc",
        "--L",
        "2",
        "--d-model",
        "32",
        "--preset",
        "tiny",
        "--max-steps",
        "4",
        "--eval-every",
        "2",
        "--data",
        str(tiny_data),
        "--trackers",
        "tensorboard,wandb",
        "--no-progress",
        "--json",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    folder = runs / "default" / result["run_id"]
    metrics = [
        m for m in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines()) if m.get("kind") != "header"
    ]
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    assert not (tmp_path / "wandb").exists()  # W&B writes into the run folder, not the cwd

    tb = read_tensorboard(folder / "trackers")
    (wb_file,) = (folder / "trackers" / "wandb").glob("offline-run-*/run-*.wandb")
    wb = {int(r["_step"]): r for r in read_wandb_history(wb_file)}
    for m in metrics:
        for key in SCALARS:
            assert tb[key][m["step"]] == pytest.approx(m[key], rel=1e-6), (key, m["step"])  # TensorBoard stores float32
            assert wb[m["step"]][key] == pytest.approx(m[key], rel=1e-12), (key, m["step"])
    assert tb["val_loss"][1] == pytest.approx(metrics[1]["val_loss"], rel=1e-6) and wb[3]["val_loss"] == pytest.approx(
        metrics[3]["val_loss"]
    )


def test_a_missing_tracker_package_names_the_extra(monkeypatch):
    import accelerate.utils
    from depthbench_nb.parallel import check_trackers

    monkeypatch.setattr(accelerate.utils, "is_wandb_available", lambda: False)
    with pytest.raises(ConfigError, match=r"tracker 'wandb' needs its package: pip install 'depthbench-nb\[wandb\]'"):
        check_trackers(["wandb"])
    with pytest.raises(ConfigError, match="unknown tracker"):
        check_trackers(["mlflow"])
