#!/usr/bin/env python
"""One GPU check of the paper-scale path: run it whole on one CUDA GPU; it writes one JSON and one Markdown file.

What it measures, in one process (every ratio is against a baseline measured in the same run):

1. copy bandwidth: a device-to-device copy of a 1 GiB bf16 buffer (GB/s = bytes read + written per second), the
   ceiling of the memory-bound kernels;
2. every Triton kernel of depthbench_nb.kernels against its torch reference at the 400m L24 shapes (bf16
   activations, fp32 parameters, 4 x 2048 tokens): forward+backward median time, GB/s over the ideal traffic
   (inputs and outputs read or written once; backward: output grads + inputs + input grads), % of the copy
   bandwidth, speed-up over torch;
3. one training step (forward, cross-entropy, backward, fused AdamW; bf16 autocast, fp32 master weights) of every
   DepthBench design at the 400m L24 shape, eager and torch.compile'd: median step time, tokens/s, peak memory,
   each as a ratio over Pre-LN in the same mode (a design that runs out of memory is measured at half the
   micro-batch, recorded, and its time ratio is per token);
4. the MFU of compiled Pre-LN 400m L24 in bf16: train FLOPs per token (depthbench_nb.costs) x tokens/s / the
   GPU's dense bf16 peak;
5. per design and mode, the roofline: a step-time model from Pre-LN's FLOP throughput in the same mode (the matmul
   rate) and the copy bandwidth of 1., applied to the design's FLOPs and the bytes of depth states its mixing moves
   (`costs.roofline`; bf16 states, AttnRes sources in fp32 as the fused path stores them), as model time / achieved
   time, and where an eager step's time goes (the top ops of one profiled step).

Targets on an H100-class GPU (the issue): MFU >= 45%; HC, mHC and AttnRes step time <= 1.07 x Pre-LN (compiled).
The report says for each whether it is met; `--strict` turns a missed target into exit status 1.

The whole check is budgeted to finish within 8 minutes (`--budget-s`, default 460 s): the designs run in the order
Pre-LN, HC, mHC, AttnRes, then the rest (each eager, then compiled), and a compiled measurement expected to end
after the budget (1.25 x the slowest compile so far) is recorded as skipped, with the reason, rather than run.

    python benchmarks/gpu_check.py                          # one CUDA GPU: gpu_check.json + gpu_check.md
    python benchmarks/gpu_check.py --out results/h200       # results/h200.json + results/h200.md
    python benchmarks/gpu_check.py --smoke --out /tmp/smoke # any CPU: the same code at tiny sizes (CI runs this)

`--smoke` runs every code path on a CPU at tiny sizes (L=2, d=64, vocabulary 512, 2 x 32 tokens): the kernels'
torch references only (Triton needs CUDA), and the compiled rows through torch.compile with the `eager` backend
(dynamo's graph capture without inductor's code generation, which would take minutes per design on a CPU; the
JSON records the backend). Its timings say nothing about a GPU. Without CUDA and without --smoke it refuses
with exit status 2 and measures nothing: GPU figures are never estimated.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_kernels_gpu: the kernel cases and timers

TARGET_MFU = 0.45
TARGET_RATIO = 1.07
TARGET_ARCHS = ("hc", "mhc", "attnres")
DESIGN_ORDER = ("preln", "hc", "mhc", "attnres", "periln", "lns", "deepnorm", "keel", "block_attnres", "moda")


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="gpu_check.py", description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--out", default="gpu_check", help="output path without suffix: OUT.json and OUT.md (default gpu_check)"
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes on a CPU: every code path, no meaningful timings")
    p.add_argument("--L", type=int, default=24, help="depth of the 400m grid shape (default 24: d = 1024)")
    p.add_argument("--micro-batch", type=int, default=8, help="sequences per training step (default 8 x 2048 tokens)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument(
        "--kernel-tokens", type=int, default=4, help="sequences of the kernel cases (default 4 x 2048 tokens)"
    )
    p.add_argument("--reps", type=int, default=20, help="timed repetitions per kernel measurement")
    p.add_argument("--steps", type=int, default=6, help="timed training steps per design and mode (after warm-up)")
    p.add_argument(
        "--warmup", type=int, default=2, help="untimed steps per design and mode (compiled: includes the compile)"
    )
    p.add_argument("--archs", default=",".join(DESIGN_ORDER), help="designs (Pre-LN is always measured first)")
    p.add_argument(
        "--compile-backend", default=None, help="torch.compile backend (default inductor; eager under --smoke)"
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=460.0,
        help="wall-clock budget (default 460 s: within 8 minutes): a compile expected to end after it is skipped",
    )
    p.add_argument(
        "--top", type=int, default=4, help="ops in the profiler breakdown of each eager row (0: no profiling)"
    )
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    a = p.parse_args(argv)
    if a.smoke:
        a.L, a.micro_batch, a.seq_len, a.kernel_tokens, a.reps, a.steps, a.warmup = 2, 2, 32, 1, 2, 1, 1
        a.compile_backend = a.compile_backend or "eager"
    a.compile_backend = a.compile_backend or "inductor"
    return a


# ---------------------------------------------------------------------------------------------------- kernels
def kernel_rows(dev, B, T, d, ffn, S_list, reps, copy_gbs) -> list[dict]:
    "Triton vs torch per kernel (fwd+bwd): ms, GB/s, % of copy bandwidth, speed-up; torch only where Triton cannot run."
    import bench_kernels_gpu as bk
    from depthbench_nb import kernels as K

    rows = []
    for label, (name, args, kwargs, gout) in bk.kernel_cases(dev, (B, T), d, ffn, 4, S_list).items():
        impls = {"torch": K._REFERENCES[name]}
        if dev.type == "cuda" and K.HAS_TRITON and name in K._TRITON_IMPLS:
            impls["triton"] = K._TRITON_IMPLS[name]
        for impl, fn in impls.items():
            try:
                m = bk.bench_kernel(fn, args, kwargs, gout, dev, reps)
            except Exception as e:  # a kernel that does not run is reported, not fatal
                rows.append(dict(kernel=label, impl=impl, error=f"{type(e).__name__}: {str(e)[:200]}"))
                continue
            gbs = m["fwd_bwd_bytes"] / (m["fwd_bwd_ms"] * 1e-3) / 1e9
            rows.append(
                dict(
                    kernel=label,
                    impl=impl,
                    fwd_bwd_ms=m["fwd_bwd_ms"],
                    fwd_bwd_gbs=gbs,
                    pct_of_copy=100 * gbs / copy_gbs,
                    fwd_ms=m["fwd_ms"],
                )
            )
        base = next((r for r in rows if r["kernel"] == label and r["impl"] == "torch" and "error" not in r), None)
        for r in rows:
            if r["kernel"] == label and "error" not in r and base:
                r["speedup_vs_torch"] = base["fwd_bwd_ms"] / r["fwd_bwd_ms"]
    return rows


# ---------------------------------------------------------------------------------------------------- designs
def step_fn(model, opt, x, y, dev):
    "One optimizer step: bf16 autocast on CUDA (fp32 on a CPU), fp32 loss, backward, AdamW."
    import torch
    import torch.nn.functional as F

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = model(x)  # [m, T, V]
        F.cross_entropy(logits.float().flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def build(arch, shape, a, dev):
    "The design's model at the check's shape with its optimizer and one fixed batch."
    import torch
    from depthbench_nb.model import build_model

    cfg = shape.model_config(arch, max_seq_len=a.seq_len)
    model = build_model(cfg, seed=0, device=dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, cfg.vocab_size, (a.micro_batch, a.seq_len + 1), generator=g).to(dev)  # [m, T+1]
    return model, opt, idx


def measure(arch, mode, model, opt, idx, a, dev) -> dict:
    "measure_at the full micro-batch; on a CUDA out-of-memory error, at half of it (recorded), down to one sequence."
    import torch

    micro = a.micro_batch
    while True:
        try:
            return measure_at(arch, mode, model, opt, idx[:micro], a, dev)
        except torch.cuda.OutOfMemoryError:
            opt.zero_grad(set_to_none=True)
            torch._dynamo.reset()
            torch.cuda.empty_cache()
            if micro == 1:
                raise
            micro //= 2
            print(f"  {arch} {mode}: out of memory, retrying with {micro} sequences per step", flush=True)


def measure_at(arch, mode, model, opt, idx, a, dev) -> dict:
    "Median step time, tokens/s and peak memory of one design in one mode (eager | compiled) on the batch idx [m, T+1]."
    import torch
    from depthbench_nb.costs import top_ops

    fwd = torch.compile(model, backend=a.compile_backend) if mode == "compiled" else model
    step = step_fn(fwd, opt, idx[:, :-1], idx[:, 1:], dev)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    for _ in range(a.warmup):
        step()  # the compile happens here
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    warm_s = time.perf_counter() - t0
    times = []
    for _ in range(a.steps):
        if dev.type == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            step()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        else:
            t1 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t1)
    sec = statistics.median(times)
    peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None
    top = (
        top_ops(step, a.top) if mode == "eager" and a.top else None
    )  # where the time goes (eager: the ops are the code's)
    if mode == "compiled":
        torch._dynamo.reset()
    tokens = idx.shape[0] * a.seq_len
    return dict(
        arch=arch,
        mode=mode,
        micro_batch=idx.shape[0],
        step_ms=1e3 * sec,
        tokens_per_s=tokens / sec,
        ms_per_ktoken=1e6 * sec / tokens,
        peak_mem_gib=peak,
        warmup_s=warm_s,
        params=sum(p.numel() for p in model.parameters()),
        top_ops=top and ", ".join(f"{name} {share:.0%}" for name, share in top),
    )


def add_ratios(rows: list[dict]) -> None:
    "Each row over Pre-LN in the same mode: step time, tokens/s, peak memory."
    base = {r["mode"]: r for r in rows if r["arch"] == "preln" and "error" not in r and "skipped" not in r}
    for r in rows:
        b = base.get(r["mode"])
        if b is None or "step_ms" not in r:
            continue
        r["step_ratio_vs_preln"] = (
            r["ms_per_ktoken"] / b["ms_per_ktoken"]
        )  # per token: a smaller micro-batch after an OOM stays comparable
        r["tokens_per_s_ratio_vs_preln"] = r["tokens_per_s"] / b["tokens_per_s"]
        if r["peak_mem_gib"] is not None and b["peak_mem_gib"]:
            r["mem_ratio_vs_preln"] = r["peak_mem_gib"] / b["peak_mem_gib"]


def add_roofline(rows: list[dict], shape, a, copy_gbs: float) -> None:
    """Each row's FLOP throughput over Pre-LN's and its roofline fraction (Pre-LN's FLOP rate in the same mode, the
    copy bandwidth)."""
    from depthbench_nb.costs import roofline, train_flops_per_token
    from depthbench_nb.config import family_of

    def flops(arch):
        return float(train_flops_per_token(shape.model_config(arch, max_seq_len=a.seq_len), a.seq_len))

    base = {r["mode"]: r for r in rows if r["arch"] == "preln" and "tokens_per_s" in r}
    for r in rows:
        b = base.get(r["mode"])
        if b is None or "tokens_per_s" not in r:
            continue
        rate = b["tokens_per_s"] * flops("preln")
        state_bytes = 4 if a.smoke or family_of(r["arch"]) == "attnres" else 2
        model = roofline(
            shape.model_config(r["arch"], max_seq_len=a.seq_len), a.seq_len, rate, copy_gbs * 1e9, state_bytes
        )
        r["flops_vs_preln"] = r["tokens_per_s"] * flops(r["arch"]) / rate
        r["mixing_bytes_per_token"] = model.mixing_bytes_per_token
        r["roofline"] = model.fraction(1 / r["tokens_per_s"])


def mfu_row(rows, shape, a, dev) -> dict:
    "MFU of compiled Pre-LN: train FLOPs per token x tokens/s / dense bf16 peak (None on a CPU or an unknown GPU)."
    from depthbench_nb.costs import train_flops_per_token
    from depthbench_nb.parallel import peak_flops

    pre = next((r for r in rows if r["arch"] == "preln" and r["mode"] == "compiled" and "tokens_per_s" in r), None)
    fpt = float(train_flops_per_token(shape.model_config("preln", max_seq_len=a.seq_len), a.seq_len))
    peak = peak_flops(dev)
    out = dict(
        arch="preln",
        mode="compiled",
        precision="bf16-mixed" if dev.type == "cuda" else "fp32 (cpu)",
        flops_per_token=fpt,
        peak_flops=peak,
        tokens_per_s=pre and pre["tokens_per_s"],
    )
    out["mfu"] = fpt * pre["tokens_per_s"] / peak if pre and peak else None
    return out


def targets(rows, mfu, smoke) -> list[dict]:
    out = [
        dict(
            name="MFU of compiled Pre-LN (bf16)",
            value=mfu["mfu"],
            target=f">= {TARGET_MFU:.0%}",
            met=None if mfu["mfu"] is None or smoke else mfu["mfu"] >= TARGET_MFU,
        )
    ]
    for arch in TARGET_ARCHS:
        r = next(
            (x for x in rows if x["arch"] == arch and x["mode"] == "compiled" and "step_ratio_vs_preln" in x), None
        )
        v = r and r["step_ratio_vs_preln"]
        out.append(
            dict(
                name=f"{arch} step time / Pre-LN (compiled)",
                value=v,
                target=f"<= {TARGET_RATIO}",
                met=None if v is None or smoke else v <= TARGET_RATIO,
            )
        )
    return out


# ---------------------------------------------------------------------------------------------------- report
def _f(v, fmt):
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def markdown(res: dict) -> str:
    env = res["env"]
    lines = [
        f"# GPU check: {env['device']}",
        "",
        f"torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}, Python {env['python']}; "
        f"compile backend `{res['compile_backend']}`; {res['elapsed_s']:.0f} s in all."
        + (" **SMOKE RUN on a CPU: tiny sizes, the timings say nothing about a GPU.**" if res["smoke"] else ""),
        "",
        f"Copy bandwidth: **{res['copy_bandwidth_gbs']:.0f} GB/s** (bf16 buffer, read + write).",
        "",
        "## Targets",
        "",
        "| check | value | target | met |",
        "|---|---|---|---|",
    ]
    for t in res["targets"]:
        v = t["value"]
        shown = "—" if v is None else (f"{v:.1%}" if "MFU" in t["name"] else f"{v:.3f}x")
        lines.append(
            f"| {t['name']} | {shown} | {t['target']} | "
            f"{'—' if t['met'] is None else ('yes' if t['met'] else '**no**')} |"
        )
    m = res["mfu"]
    lines += [
        "",
        f"MFU row: Pre-LN {res['shape']}, compiled, {m['precision']}: {_f(m['tokens_per_s'], ',.0f')} tokens/s × "
        f"{m['flops_per_token']:.3e} FLOPs/token / peak {_f(m['peak_flops'], '.3e')} FLOP/s "
        f"= **{_f(m['mfu'], '.1%')}**.",
        "",
        f"## Designs at {res['shape']} ({res['tokens_per_step']:,} tokens per step; "
        "ratios over Pre-LN in the same mode)",
        "",
        "| design | mode | seqs/step | step ms | × Pre-LN (per token) | tokens/s | × Pre-LN | FLOP/s × Pre-LN "
        "| roofline | peak GiB | × Pre-LN | top ops |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["designs"]:
        if "step_ms" not in r:
            lines.append(f"| {r['arch']} | {r['mode']} | | {r.get('skipped') or r.get('error')} | | | | | | | | |")
            continue
        lines.append(
            f"| {r['arch']} | {r['mode']} | {r['micro_batch']} | {r['step_ms']:.1f} | "
            f"{_f(r.get('step_ratio_vs_preln'), '.3f')} | "
            f"{r['tokens_per_s']:,.0f} | {_f(r.get('tokens_per_s_ratio_vs_preln'), '.3f')} | "
            f"{_f(r.get('flops_vs_preln'), '.3f')} | "
            f"{_f(r.get('roofline'), '.3f')} | {_f(r['peak_mem_gib'], '.2f')} | "
            f"{_f(r.get('mem_ratio_vs_preln'), '.3f')} | "
            f"{r.get('top_ops') or ''} |"
        )
    lines += [
        "",
        f"## Kernels (forward + backward, {res['kernel_shape']})",
        "",
        "| kernel | impl | ms | GB/s | % of copy | × torch |",
        "|---|---|---|---|---|---|",
    ]
    for r in res["kernels"]:
        if "error" in r:
            lines.append(f"| {r['kernel']} | {r['impl']} | {r['error']} | | | |")
            continue
        lines.append(
            f"| {r['kernel']} | {r['impl']} | {r['fwd_bwd_ms']:.3f} | {r['fwd_bwd_gbs']:.0f} | "
            f"{r['pct_of_copy']:.0f}% | "
            f"{_f(r.get('speedup_vs_torch'), '.2f')} |"
        )
    if res["skipped"]:
        lines += ["", "Skipped: " + "; ".join(res["skipped"]) + "."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    a = parse_args(argv)
    import torch

    if not a.smoke and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA GPU here (torch.cuda.is_available() is False): nothing measured. "
            "Run it on one CUDA GPU; "
            "GPU figures are never estimated. (--smoke runs the same code at tiny sizes on a CPU.)",
            file=sys.stderr,
        )
        return 2
    import bench_kernels_gpu as bk
    from depthbench_nb.config import atomic_write_json, atomic_write_text
    from depthbench_nb.shapes import shape_for

    t_start = time.perf_counter()
    dev = torch.device("cpu") if a.smoke else torch.device("cuda")
    grid = "tiny" if a.smoke else "400m"
    if a.smoke:  # smaller than the tiny grid's 4M-parameter shapes: code paths, not speed
        from depthbench_nb.config import ffn_hidden_default
        from depthbench_nb.shapes import Shape

        shape = Shape(a.L, 64, 4, 4, ffn_hidden_default(64), 512)
    else:
        shape = shape_for(grid, a.L)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    env = dict(
        device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (smoke)",
        torch=torch.__version__,
        triton=triton_version,
        cuda=torch.version.cuda,
        python=platform.python_version(),
    )
    out = Path(a.out)
    res = dict(
        env=env,
        smoke=a.smoke,
        compile_backend=a.compile_backend,
        shape=f"{grid} L{shape.n_layer} d{shape.d_model}",
        tokens_per_step=a.micro_batch * a.seq_len,
        skipped=[],
    )

    def save():
        "Write what has been measured so far (a run cut short still leaves its figures)."
        res["elapsed_s"] = time.perf_counter() - t_start
        atomic_write_json(out.with_suffix(".json"), res)
        if all(k in res for k in ("designs", "kernels", "mfu", "targets")):
            atomic_write_text(out.with_suffix(".md"), markdown(res))

    print(
        f"# gpu_check on {env['device']} (torch {env['torch']}); {res['shape']}, "
        f"{res['tokens_per_step']:,} tokens per step",
        flush=True,
    )
    res["copy_bandwidth_gbs"] = bk.copy_bandwidth_gbs(dev, (1 << 20) if a.smoke else (1 << 30), max(3, a.reps))
    print(f"copy bandwidth {res['copy_bandwidth_gbs']:.0f} GB/s", flush=True)
    B, T = a.kernel_tokens, a.seq_len
    S_list = [shape.n_layer + 1, 2 * shape.n_layer + 1]
    res["kernel_shape"] = f"{B} x {T} tokens, d {shape.d_model}, ffn {shape.ffn_hidden}, n 4, AttnRes S {S_list}"
    res["kernels"] = kernel_rows(dev, B, T, shape.d_model, shape.ffn_hidden, S_list, a.reps, res["copy_bandwidth_gbs"])
    for r in res["kernels"]:
        print(
            f"  {r['kernel']:>20} {r['impl']:>6}: "
            + (
                r["error"]
                if "error" in r
                else f"{r['fwd_bwd_ms']:.3f} ms  {r['fwd_bwd_gbs']:.0f} GB/s  {r['pct_of_copy']:.0f}% of copy"
            ),
            flush=True,
        )
    if dev.type != "cuda":
        res["skipped"].append("Triton kernels (they need CUDA): torch references only")
    save()

    archs = [x.strip() for x in a.archs.split(",") if x.strip()]
    archs = ["preln"] + [x for x in archs if x != "preln"]
    rows = []
    for arch in archs:  # Pre-LN, then the designs with a target, then the rest (DESIGN_ORDER)
        try:
            model, opt, idx = build(arch, shape, a, dev)
        except Exception as e:
            rows += [
                dict(arch=arch, mode=m, error=f"{type(e).__name__}: {str(e)[:300]}") for m in ("eager", "compiled")
            ]
            continue
        for mode in ("eager", "compiled"):
            elapsed = time.perf_counter() - t_start
            seen = [
                r["warmup_s"] + a.steps * r["step_ms"] / 1e3
                for r in rows
                if r.get("mode") == "compiled" and "warmup_s" in r
            ]
            expect = (
                1.25 * max(seen) if seen else (10.0 if a.smoke else 120.0)
            )  # the next compile costs about the slowest so far
            if mode == "compiled" and elapsed + expect > a.budget_s:
                rows.append(
                    dict(
                        arch=arch,
                        mode=mode,
                        skipped=f"time budget ({elapsed:.0f} s + ~{expect:.0f} s > {a.budget_s:.0f} s)",
                    )
                )
                res["skipped"].append(f"{arch} compiled (time budget)")
                continue
            try:
                row = measure(arch, mode, model, opt, idx, a, dev)
            except Exception as e:  # one design failing is reported; the others still run
                row = dict(arch=arch, mode=mode, error=f"{type(e).__name__}: {str(e)[:300]}")
                torch._dynamo.reset()
            rows.append(row)
            print(
                f"  {arch:>14} {mode:>8}: "
                + (
                    row.get("error")
                    or f"{row['step_ms']:.1f} ms  {row['tokens_per_s']:,.0f} tok/s  "
                    f"peak {_f(row['peak_mem_gib'], '.2f')} GiB  (warm-up {row['warmup_s']:.0f} s)"
                ),
                flush=True,
            )
            add_ratios(rows)
            add_roofline(rows, shape, a, res["copy_bandwidth_gbs"])
            res["designs"] = rows
            save()
        del model, opt, idx
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    add_ratios(rows)
    add_roofline(rows, shape, a, res["copy_bandwidth_gbs"])
    res["designs"] = rows
    res["mfu"] = mfu_row(rows, shape, a, dev)
    res["targets"] = targets(rows, res["mfu"], a.smoke)
    save()
    print(f"\nwrote {out.with_suffix('.json')} and {out.with_suffix('.md')} ({res['elapsed_s']:.0f} s)")
    for t in res["targets"]:
        print(f"  {t['name']}: {t['value']} (target {t['target']}, met: {t['met']})")
    missed = [t["name"] for t in res["targets"] if t["met"] is False]
    failed = [f"{r['arch']} {r['mode']}" for r in rows if "error" in r]
    if failed:
        print(f"FAILED: {', '.join(failed)}")
    return 1 if failed or (a.strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
