"""Forward+backward step time and memory of every design relative to Pre-LN, measured in one run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_models.py                  # CPU, tiny shape (~1 min)
    .venv/bin/python benchmarks/bench_models.py --shape 400m --device cuda          # the 400M L24 shape, bf16 autocast

Memory: on CUDA the peak allocated bytes of one step (torch.cuda.max_memory_allocated, parameters included); on
CPU, where torch has no allocator statistics, the bytes of the tensors autograd saves for backward (the activation
memory, deduplicated by storage), which is what differs between designs. Times are the median of --steps steps
after --warmup steps. This is a benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from depthbench_nb.config import atomic_write_json
from depthbench_nb.model import build_model, n_params
from depthbench_nb.shapes import shape_for

DESIGNS = ["preln", "periln", "lns", "deepnorm", "keel", "moda", "hc", "mhc", "attnres", "block_attnres"]
SHAPES = {  # name: (model config kwargs, batch, seq_len)
    "tiny": (
        dict(n_layer=8, d_model=64, n_head=4, vocab_size=256, max_seq_len=128),
        4,
        128,
    ),  # block_attnres: 8 groups of 2
    "400m": (None, 1, 2048),  # shape_for('400m', 24): d 1024, 16 heads, vocab 50,280
}


def model_config(shape: str, arch: str):
    kw, _, _ = SHAPES[shape]
    if kw is None:
        return shape_for("400m", 24).model_config(arch)
    from depthbench_nb.config import ModelConfig

    return ModelConfig(arch=arch, **kw)


def saved_activation_bytes(model, idx, autocast) -> int:
    "Bytes of the tensors saved for backward during one forward (each storage once)."
    seen = {}

    def pack(t):
        try:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        except Exception:
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast():
        loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1).float(), idx[:, 1:].flatten())
    del loss
    return sum(seen.values())


def bench(arch: str, shape: str, device: str, steps: int, warmup: int) -> dict:
    row = measure(arch, shape, device, steps, warmup)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # the design's model went with measure()
    return row


def measure(arch: str, shape: str, device: str, steps: int, warmup: int) -> dict:
    "One design's step time and memory; its model is freed when this returns."
    cfg = model_config(shape, arch)
    _, batch, seq = SHAPES[shape]
    model = build_model(cfg).to(device)
    idx = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device)
    cuda = device.startswith("cuda")
    autocast = (
        (lambda: torch.autocast("cuda", dtype=torch.bfloat16))
        if cuda
        else (lambda: torch.autocast("cpu", enabled=False))
    )

    def step():
        with autocast():
            logits = model(idx[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), idx[:, 1:].flatten())
        loss.backward()
        model.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    times = []
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    row = dict(
        arch=arch,
        params=n_params(model),
        step_ms=1e3 * statistics.median(times),
        activation_bytes=saved_activation_bytes(model, idx, autocast),
    )
    if cuda:
        row["peak_bytes"] = torch.cuda.max_memory_allocated()
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=list(SHAPES), default="tiny")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--designs", default=",".join(DESIGNS), help="comma-separated (preln is always measured first)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    a = p.parse_args(argv)
    torch.manual_seed(0)
    designs = ["preln"] + [d for d in a.designs.split(",") if d and d != "preln"]
    rows = []
    for arch in designs:
        rows.append(bench(arch, a.shape, a.device, a.steps, a.warmup))
        print(f"measured {arch}", file=sys.stderr, flush=True)
    base = rows[0]
    mem_key = "peak_bytes" if "peak_bytes" in base else "activation_bytes"
    for r in rows:
        r["time_ratio"] = r["step_ms"] / base["step_ms"]
        r["memory_ratio"] = r[mem_key] / base[mem_key]
        r["activation_ratio"] = r["activation_bytes"] / base["activation_bytes"]
    _, batch, seq = SHAPES[a.shape]
    print(
        f"shape {a.shape} (batch {batch} x {seq} tokens), device {a.device}, torch {torch.__version__}, "
        f"median of {a.steps} fwd+bwd steps; memory = {mem_key}"
    )
    print(f"{'arch':<14}{'params':>14}{'ms/step':>10}{'time x':>8}{'memory MiB':>12}{'mem x':>7}{'act x':>7}")
    for r in rows:
        print(
            f"{r['arch']:<14}{r['params']:>14,}{r['step_ms']:>10.1f}{r['time_ratio']:>8.2f}"
            f"{r[mem_key] / 2**20:>12.1f}{r['memory_ratio']:>7.2f}{r['activation_ratio']:>7.2f}"
        )
    if a.json:
        atomic_write_json(a.json, dict(shape=a.shape, device=a.device, memory=mem_key, rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
