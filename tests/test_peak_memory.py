"""Peak memory per run: a run records its own peak, not the process's. On a GPU the trainer resets
CUDA's peak statistics at every start and resume; on a CPU, whose only peak (ru_maxrss) never resets, it records none
and says why. The GPU path is checked on a CPU by standing in for torch.cuda's two functions."""

import resource

import torch

from depthbench_nb import callbacks, parallel
from depthbench_nb.runs import _read_metrics_headers, read_metrics, read_result, run_dir
from depthbench_nb.trainer import train

from test_trainer import tiny_run

GIB = 2**30


def test_a_two_step_cpu_run_after_the_process_held_3_gib_records_none_and_why(runs_dir, tiny_data, monkeypatch):
    # the process once held 3 GiB: ru_maxrss (KiB on Linux), its peak, says so for the rest of its life (allocating
    # and freeing a real 3 GiB tensor does the same, in seconds of page faults)
    held = resource.getrusage(resource.RUSAGE_SELF)
    fake = type("Usage", (), {"ru_maxrss": max(held.ru_maxrss, 3 * GIB // 1024 + 1)})()
    monkeypatch.setattr(resource, "getrusage", lambda who: fake)
    run = tiny_run("preln", data=tiny_data, steps=2, study="mem")
    res = train(run, progress=False)
    rows = read_metrics(run_dir(run))
    assert res["status"] == "completed" and len(rows) == 2
    assert res["peak_mem_bytes"] is None or res["peak_mem_bytes"] < GIB  # its own peak, or none
    assert all(r.get("peak_mem_bytes") is None for r in rows)  # no row claims the process's peak
    assert "not measured" in res["peak_mem_note"] and "ru_maxrss" in res["peak_mem_note"]
    assert res["peak_mem_per_run"] is False
    assert read_result(run_dir(run))["peak_mem_note"] == res["peak_mem_note"]  # the record reads back by its schema
    assert _read_metrics_headers(run_dir(run))[0]["peak_mem_note"] == res["peak_mem_note"]  # and metrics.jsonl says


def test_the_gpu_path_resets_cuda_peak_statistics_and_reads_the_peak_since(monkeypatch):
    calls, peak = [], {"bytes": 3 * GIB}  # a CUDA allocator whose process once held 3 GiB

    def reset(device=None):
        calls.append(device)
        peak["bytes"] = 5_000

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: peak["bytes"])
    gpu = torch.device("cuda", 0)
    assert parallel.peak_memory_bytes(gpu) == 3 * GIB  # before a reset: the process's peak
    parallel._reset_peak_memory(gpu)
    assert calls == [gpu] and parallel.peak_memory_bytes(gpu) == 5_000
    assert parallel._peak_memory_note(gpu) is None  # a GPU measures the run: nothing to explain
    parallel._reset_peak_memory(torch.device("cpu"))  # nothing to reset on a CPU: torch.cuda is not touched
    assert calls == [gpu] and parallel.peak_memory_bytes(torch.device("cpu")) is None


def test_the_trainer_resets_the_peak_at_the_start_and_on_resume(runs_dir, tiny_data, monkeypatch):
    "A stand-in GPU allocator: the process peaks at 3 GiB until a reset, and again between the two segments."
    resets, peak = [], {"bytes": 3 * GIB}

    def reset(device):
        resets.append(device)
        peak["bytes"] = 1_000 * (len(resets))  # the peak from here: what the run allocates (1 kB, then 2 kB)

    monkeypatch.setattr(callbacks, "_reset_peak_memory", reset)
    monkeypatch.setattr(callbacks, "peak_memory_bytes", lambda device: peak["bytes"])
    run = tiny_run("preln", data=tiny_data, steps=4, study="mem", checkpoint_every=2)
    assert train(run, progress=False, stop_after=2)["status"] == "stopped"
    assert len(resets) == 1  # at the start
    peak["bytes"] = 3 * GIB  # the process held 3 GiB between the stop and the resume
    assert train(run, progress=False)["status"] == "completed"
    assert len(resets) == 2 and all(d.type == "cpu" for d in resets)  # and on resume, with the run's device
    rows = read_metrics(run_dir(run))
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert [r["peak_mem_bytes"] for r in rows] == [1_000, 1_000, 2_000, 2_000]  # each segment's own peak


def test_records_before_and_after_the_per_run_peak_read_by_the_schema(tmp_path):
    "A record from before the new keys reads as it was; the new keys are typed (a wrong type makes the file corrupt)."
    folder = tmp_path / "r"  # a record names its folder's run
    folder.mkdir()
    import json

    import pytest

    from depthbench_nb.config import CorruptFile
    from depthbench_nb.runs import write_result

    old = dict(status="completed", run_id="r", steps=2, tokens=64, peak_mem_bytes=3_800_000_000)  # a CPU's ru_maxrss
    write_result(
        folder,
        old
        | {k: None for k in ("study", "arch", "n_layer", "d_model", "preset", "lr", "seed")}
        | {
            k: None
            for k in (
                "final_val_loss",
                "best_val_loss",
                "wall_time_s",
                "train_flops",
                "params_total",
                "params_backbone",
                "provenance",
            )
        },
    )
    assert read_result(folder)["peak_mem_bytes"] == 3_800_000_000 and "peak_mem_per_run" not in read_result(folder)
    good = json.loads((folder / "result.json").read_text()) | dict(peak_mem_bytes=None, peak_mem_per_run=False)
    (folder / "result.json").write_text(json.dumps(good | dict(peak_mem_note="not measured: on a CPU ...")))
    assert read_result(folder)["peak_mem_note"].startswith("not measured")
    (folder / "result.json").write_text(json.dumps(good | dict(peak_mem_per_run="yes")))
    with pytest.raises(CorruptFile, match="peak_mem_per_run: 'yes' \\(expected bool or null\\)"):
        read_result(folder)
