"""Training throughput of every design relative to Pre-LN, against a roofline, measured in one run.

CPU (default): the tiny preset's shape at depth L, its batch (global_batch x seq_len tokens per step), fp32:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_train.py --L 8,32 \
        --archs preln,hc,mhc,attnres,block_attnres,moda --steps 4

GPU: the paper shapes in bf16 autocast, with MFU (dense bf16 peak of the GPU) and the overhead ratios of
HC / mHC / AttnRes against Pre-LN at the same shape:

    .venv/bin/python benchmarks/bench_train.py --preset 400m --L 16,24 --archs preln,hc,mhc,attnres --micro-batch 8

Each step is a full optimizer step (forward, backward, AdamW) on random tokens; the first `--warmup` steps are
not timed; the median step time is reported. On CPU the designs are timed in interleaved rounds (one step of
each design per round), so load from other processes on a shared machine affects every design alike.

Per design and depth a row gives tokens/s, tokens/s and FLOP throughput relative to Pre-LN (tokens/s x training
FLOPs per token from `depthbench_nb.costs`), and the roofline: a step-time model from two rates measured in the same
run on the same device, the matmul rate (Pre-LN's FLOP throughput at that depth) and the copy bandwidth (a copy
of a buffer beyond the caches), applied to the design's FLOPs and the bytes of depth states its mixing must move
(`costs.mixing_bytes_per_token`). `roofline` = model time / achieved time (1: at the roofline; 0.5: twice as slow as
the model); `top_ops` = where one profiled step's time goes (share of the aten ops' self time).

    --mixing fused,reference   time both depth-mixing paths side by side (`DEPTHBENCH_MIXING`; default: the
                               default path)
    --compile                  also time torch.compile'd steps next to eager (each compiled model is built and
                               warmed first)
    --memory                   peak RSS of one step per design and mixing path, each in a fresh process (CPU);
                               also with glibc's mmap threshold fixed at 128 KiB (`fixed mmap`: no heap
                               fragmentation of large blocks, the peak of the live tensors), and after four more
                               steps (`after 6`: memory a step leaves behind makes it grow)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import torch.nn.functional as F

from depthbench_nb.config import ARCHS
from depthbench_nb.costs import copy_bandwidth, roofline, top_ops, train_flops_per_token
from depthbench_nb.parallel import autocast_context, peak_flops, resolve_precision
from depthbench_nb.optim import build_optimizers
from depthbench_nb.trainer import init_model
from depthbench_nb.run_params import make_run_config


class Bench:
    "One design's model, optimizer and batch plan; `step()` times one full optimizer step on random tokens."

    def __init__(
        self,
        run,
        micro_batch: int,
        device: torch.device,
        mixing: str = None,
        compiled: bool = False,
        compile_backend: str = "inductor",
    ):
        self.run, self.device, self.micro, self.mixing = run, device, micro_batch, mixing
        self.mode = "compiled" if compiled else "eager"
        self.precision = resolve_precision(run.train.precision, device)
        self.model = init_model(run).to(device)
        self.model.mixing = mixing
        if self.precision == "bf16-pure":
            self.model = self.model.to(torch.bfloat16)
        self.forward = torch.compile(self.model, backend=compile_backend) if compiled else self.model
        self.opts, _ = build_optimizers(self.model, run, 1000)
        self.gen = torch.Generator().manual_seed(0)
        self.times: list[float] = []
        self.warmup_s = 0.0  # untimed steps, the compile included

    def warm_up(self, steps: int) -> None:
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step(timed=False)
        self.warmup_s = time.perf_counter() - t0

    def step(self, timed: bool = True) -> None:
        t, m = self.run.train, self.micro
        x = torch.randint(0, self.run.model.vocab_size, (t.global_batch, t.seq_len + 1), generator=self.gen)  # [G, T+1]
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for j in range(t.global_batch // m):
            xb = x[j * m : (j + 1) * m].to(self.device)  # [m, T+1]
            with autocast_context(self.precision, self.device):
                logits = self.forward(xb[:, :-1])  # [m, T, V]
            (F.cross_entropy(logits.float().flatten(0, 1), xb[:, 1:].flatten()) * m / t.global_batch).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        for o in self.opts:
            o.step()
            o.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        if timed:
            self.times.append(time.perf_counter() - t0)

    def row(self) -> dict:
        t = self.run.train
        sec = statistics.median(self.times)
        tok_s = t.global_batch * t.seq_len / sec
        row = dict(
            arch=self.run.model.arch,
            n_layer=self.run.model.n_layer,
            d_model=self.run.model.d_model,
            mode=self.mode,
            mixing="reference"
            if self.mode == "compiled"
            else self.mixing or os.environ.get("DEPTHBENCH_MIXING", "fused"),  # compile traces the reference
            tokens_per_s=round(tok_s, 1),
            s_per_step=round(sec, 3),
            warmup_s=round(self.warmup_s, 1),
            flops_per_token=train_flops_per_token(self.run.model, t.seq_len),
        )
        peak = peak_flops(self.device)
        if peak:
            row["mfu"] = round(row["flops_per_token"] * tok_s / peak, 4)
        if self.device.type == "cuda":
            row["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        return row

    def free(self):
        del self.model, self.forward, self.opts
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


def add_roofline(rows: list[dict], runs: dict, copy_bps: float, bytes_per_elem: int) -> None:
    """Ratios over Pre-LN of the same depth and mode, and the roofline built from Pre-LN's FLOP rate and the copy
    bandwidth."""
    for row in rows:
        base = next(
            r for r in rows if r["arch"] == "preln" and r["n_layer"] == row["n_layer"] and r["mode"] == row["mode"]
        )
        matmul_rate = base["tokens_per_s"] * base["flops_per_token"]
        model = roofline(
            runs[row["arch"], row["n_layer"]].model,
            runs[row["arch"], row["n_layer"]].train.seq_len,
            matmul_rate,
            copy_bps,
            bytes_per_elem,
        )
        row["ratio_vs_preln"] = round(row["tokens_per_s"] / base["tokens_per_s"], 3)
        row["flops_vs_preln"] = round(row["tokens_per_s"] * row["flops_per_token"] / matmul_rate, 3)
        row["mixing_bytes_per_token"] = model.mixing_bytes_per_token
        row["roofline_s_per_step"] = round(model.seconds_per_token() * row["tokens_per_s"] * row["s_per_step"], 3)
        row["roofline"] = round(model.fraction(1 / row["tokens_per_s"]), 3)


LATER_STEPS = 4  # steps after the first two: a step that leaves memory behind shows as a growing peak
FIXED_MMAP = dict(MALLOC_MMAP_THRESHOLD_="131072")  # glibc: every block >= 128 KiB its own mapping, unmapped when freed


def peak_rss_rows(a, archs: list[str], mixings: list[str]) -> list[dict]:
    """Peak RSS of one training step per design, mixing path and depth, each in a fresh Python process (CPU): with
    glibc's default allocator, and with a fixed mmap threshold (`FIXED_MMAP`), where freed large blocks leave the
    process at once, so the peak follows the live tensors rather than how the heap fragmented."""
    rows = []
    for L in (int(x) for x in a.L.split(",")):
        for arch in archs:
            for mixing in mixings:
                row = _rss_child_row(a.preset, arch, L, mixing, {})
                row["peak_rss_fixed_mmap_mib"] = _rss_child_row(a.preset, arch, L, mixing, FIXED_MMAP)["peak_rss_mib"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def _rss_child_row(preset: str, arch: str, L: int, mixing: str, env: dict) -> dict:
    cmd = [sys.executable, __file__, "--rss-child", f"{arch},{L},{mixing}", "--preset", preset]
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, DEPTHBENCH_MIXING=mixing, **env))
    if out.returncode:
        raise RuntimeError(f"peak RSS of {arch} L{L} ({mixing}) failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def rss_child(spec: str, preset: str) -> None:
    """Body of a --memory child: build, run two steps and then `LATER_STEPS` more; print the process's peak RSS after
    the first two and after all of them (memory a step leaves behind grows the second), and the RSS before the first."""
    arch, L, mixing = spec.split(",")
    run = make_run_config(arch, L=int(L), preset=preset, verbose=False)
    b = Bench(run, run.train.global_batch, torch.device("cpu"), mixing)
    before = _peak_rss_kib()
    b.step()
    b.step()
    peak = _peak_rss_kib()
    for _ in range(LATER_STEPS):
        b.step()
    print(
        json.dumps(
            dict(
                arch=arch,
                n_layer=int(L),
                mixing=mixing,
                rss_before_step_mib=round(before / 1024, 1),
                peak_rss_mib=round(peak / 1024, 1),
                step_mib=round((peak - before) / 1024, 1),
                peak_rss_later_mib=round(_peak_rss_kib() / 1024, 1),
            )
        )
    )


def _peak_rss_kib() -> int:
    "This process's peak resident set (VmHWM; ru_maxrss would carry the launching process's peak across exec)."
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--L", default="8", help="comma-separated depths")
    p.add_argument("--archs", default=",".join(a for a in ARCHS if a != "looped"))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help="sequences per forward (default: the whole global batch on CPU, 8 on GPU)",
    )
    p.add_argument("--global-batch", type=int, default=None, help="override the preset batch (e.g. to fit one GPU)")
    p.add_argument(
        "--precision", default=None, help="auto (bf16 autocast on GPU, fp32 on CPU) | fp32 | bf16-mixed | bf16-pure"
    )
    p.add_argument(
        "--sequential",
        action="store_true",
        help="time designs one after another (default on GPU) instead of interleaved rounds",
    )
    p.add_argument(
        "--mixing",
        default=None,
        help="comma-separated depth-mixing paths timed side by side: fused, reference (default: the default path)",
    )
    p.add_argument(
        "--compile", action="store_true", help="also time torch.compile'd steps of every design next to eager"
    )
    p.add_argument(
        "--compile-backend", default="inductor", help="torch.compile backend for --compile (default inductor)"
    )
    p.add_argument("--top", type=int, default=5, help="ops in the profiler breakdown of each row (0: no profiling)")
    p.add_argument(
        "--memory", action="store_true", help="peak RSS of one step per design and mixing path, each in a fresh process"
    )
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    p.add_argument("--rss-child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.rss_child:
        return rss_child(a.rss_child, a.preset)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    archs = [x for x in a.archs.split(",") if x]
    archs = ["preln"] + [x for x in archs if x != "preln"]  # the baseline first
    mixings = a.mixing.split(",") if a.mixing else [None]
    load = os.getloadavg()
    copy_bps = copy_bandwidth(device)
    print(
        f"# {device}, copy bandwidth {copy_bps / 1e9:.1f} GB/s, load average {load[0]:.1f} (1 min), "
        f"{os.cpu_count()} cores",
        flush=True,
    )
    rows, runs = [], {}
    for L in (int(x) for x in a.L.split(",")):
        plans = []
        for arch in archs:
            run = make_run_config(arch, L=L, preset=a.preset, verbose=False, precision=a.precision)
            if a.global_batch:
                run = run.replace(train=run.train.replace(global_batch=a.global_batch))
            runs[arch, L] = run
            for mode in ("eager", "compiled") if a.compile else ("eager",):
                for mixing in (
                    mixings if arch != "preln" and mode == "eager" else mixings[:1]
                ):  # Pre-LN has no depth mixing; compiled: one path
                    plans.append((run, mixing, mode == "compiled"))

        def micro(run):
            return a.micro_batch or (run.train.global_batch if device.type == "cpu" else min(8, run.train.global_batch))

        def make(run, mixing, compiled):
            return Bench(run, micro(run), device, mixing, compiled, a.compile_backend)

        def profile(b):
            return ", ".join(f"{name} {share:.0%}" for name, share in top_ops(lambda: b.step(timed=False), a.top))

        if a.sequential or device.type == "cuda":  # one model at a time (paper shapes do not all fit at once)
            measured = []
            for plan in plans:
                b = make(*plan)
                b.warm_up(a.warmup)
                for _ in range(a.steps):
                    b.step()
                measured.append(b.row() | (dict(top_ops=profile(b)) if a.top else {}))
                b.free()
        else:  # interleaved rounds: load changes on a shared CPU hit every design alike
            benches = [make(*plan) for plan in plans]
            for b in benches:
                b.warm_up(a.warmup)  # warm-up (and compile) first, so that the timed rounds interleave
            for _ in range(a.steps):
                for b in benches:
                    b.step()
            measured = [b.row() | (dict(top_ops=profile(b)) if a.top else {}) for b in benches]
        add_roofline(
            measured, runs, copy_bps, 4 if resolve_precision(runs["preln", L].train.precision, device) == "fp32" else 2
        )
        for row in measured:
            print(json.dumps(row), flush=True)
        rows += measured
    print(
        f"\n{'arch':>14} {'L':>3} {'d':>5} {'mode':>8} {'mixing':>9} "
        f"{'tok/s':>9} {'vs preln':>8} {'FLOPs vs':>8} {'roofline':>8}"
        + ("   MFU" if "mfu" in rows[0] else "")
        + ("  top ops" if a.top else "")
    )
    for r in rows:
        print(
            f"{r['arch']:>14} {r['n_layer']:>3} {r['d_model']:>5} {r['mode']:>8} {r['mixing']:>9} "
            f"{r['tokens_per_s']:>9.1f} "
            f"{r['ratio_vs_preln']:>8.3f} {r['flops_vs_preln']:>8.3f} {r['roofline']:>8.3f}"
            + (f"  {r['mfu']:.3f}" if "mfu" in r else "")
            + (f"  {r['top_ops']}" if a.top else "")
        )
    memory = peak_rss_rows(a, archs, [m or "fused" for m in mixings]) if a.memory else None
    if memory:
        print(
            f"\n{'arch':>14} {'L':>3} {'mixing':>9} {'peak RSS MiB':>12} {'step MiB':>9} {'fixed mmap':>10} "
            f"{f'after {2 + LATER_STEPS}':>9}"
        )
        for r in memory:
            print(
                f"{r['arch']:>14} {r['n_layer']:>3} {r['mixing']:>9} {r['peak_rss_mib']:>12.1f} {r['step_mib']:>9.1f} "
                f"{r['peak_rss_fixed_mmap_mib']:>10.1f} {r['peak_rss_later_mib']:>9.1f}"
            )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                dict(
                    device=str(device),
                    preset=a.preset,
                    copy_bandwidth_gbs=copy_bps / 1e9,
                    load_average=load,
                    cores=os.cpu_count(),
                    rows=rows,
                    memory=memory,
                ),
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
