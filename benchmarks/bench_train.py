"""Training throughput of every design relative to Pre-LN, measured in one run.

CPU (default): the tiny preset's shape at depth L, its batch (global_batch x seq_len tokens per step), fp32:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_train.py --L 8 --steps 3

GPU: the paper shapes in bf16 autocast, with MFU (dense bf16 peak of the GPU) and the overhead ratios of
HC / mHC / AttnRes against Pre-LN at the same shape:

    .venv/bin/python benchmarks/bench_train.py --preset 400m --L 16,24 --archs preln,hc,mhc,attnres --micro-batch 8

Each step is a full optimizer step (forward, backward, AdamW) on random tokens; the first `--warmup` steps are
not timed; the median step time is reported. On CPU the designs are timed in interleaved rounds (one step of
each design per round), so load from other processes on a shared machine affects every design alike. Ratios are
tokens/s of the design / tokens/s of preln at the same shape, measured in this process.
"""
import argparse
import json
import os
import statistics
import time

os.environ.setdefault('OMP_NUM_THREADS', '1')

import torch
import torch.nn.functional as F

from depthbench_nb.config import ARCHS
from depthbench_nb.costs import train_flops_per_token
from depthbench_nb.trainer import (autocast_context, build_optimizers, init_model, make_run_config, peak_flops,
                                   resolve_precision)


class Bench:
    "One design's model, optimizer and batch plan; `step()` times one full optimizer step on random tokens."

    def __init__(self, run, micro_batch: int, device: torch.device):
        self.run, self.device, self.micro = run, device, micro_batch
        self.precision = resolve_precision(run.train.precision, device)
        self.model = init_model(run).to(device)
        if self.precision == 'bf16-pure': self.model = self.model.to(torch.bfloat16)
        self.opts, _ = build_optimizers(self.model, run, 1000)
        self.gen = torch.Generator().manual_seed(0)
        self.times: list[float] = []

    def step(self, timed: bool = True) -> None:
        t, m = self.run.train, self.micro
        x = torch.randint(0, self.run.model.vocab_size, (t.global_batch, t.seq_len + 1), generator=self.gen)  # [G, T+1]
        if self.device.type == 'cuda': torch.cuda.synchronize()
        t0 = time.perf_counter()
        for j in range(t.global_batch // m):
            xb = x[j * m:(j + 1) * m].to(self.device)                                                       # [m, T+1]
            with autocast_context(self.precision, self.device):
                logits = self.model(xb[:, :-1])                                                              # [m, T, V]
            (F.cross_entropy(logits.float().flatten(0, 1), xb[:, 1:].flatten()) * m / t.global_batch).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        for o in self.opts: o.step(); o.zero_grad(set_to_none=True)
        if self.device.type == 'cuda': torch.cuda.synchronize()
        if timed: self.times.append(time.perf_counter() - t0)

    def row(self) -> dict:
        t = self.run.train
        sec = statistics.median(self.times)
        tok_s = t.global_batch * t.seq_len / sec
        row = dict(arch=self.run.model.arch, n_layer=self.run.model.n_layer, d_model=self.run.model.d_model,
                   tokens_per_s=round(tok_s, 1), s_per_step=round(sec, 3))
        peak = peak_flops(self.device)
        if peak: row['mfu'] = round(train_flops_per_token(self.run.model, t.seq_len) * tok_s / peak, 4)
        if self.device.type == 'cuda': row['peak_mem_gib'] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        return row

    def free(self):
        del self.model, self.opts
        if self.device.type == 'cuda': torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--preset', default='tiny')
    p.add_argument('--L', default='8', help='comma-separated depths')
    p.add_argument('--archs', default=','.join(a for a in ARCHS if a != 'looped'))
    p.add_argument('--steps', type=int, default=3)
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--micro-batch', type=int, default=None, help='sequences per forward (default: the whole global batch on CPU, 8 on GPU)')
    p.add_argument('--global-batch', type=int, default=None, help='override the preset batch (e.g. to fit one GPU)')
    p.add_argument('--precision', default=None, help='auto (bf16 autocast on GPU, fp32 on CPU) | fp32 | bf16-mixed | bf16-pure')
    p.add_argument('--sequential', action='store_true', help='time designs one after another (default on GPU) instead of interleaved rounds')
    p.add_argument('--json', default=None, help='also write the rows to this JSON file')
    a = p.parse_args(argv)
    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    archs = a.archs.split(',')
    archs = ['preln'] + [x for x in archs if x != 'preln']   # the baseline first
    rows = []
    for L in (int(x) for x in a.L.split(',')):
        runs = []
        for arch in archs:
            run = make_run_config(arch, L=L, preset=a.preset, verbose=False, precision=a.precision)
            if a.global_batch: run = run.replace(train=run.train.replace(global_batch=a.global_batch))
            runs.append(run)
        micro = lambda run: a.micro_batch or (run.train.global_batch if device.type == 'cpu' else min(8, run.train.global_batch))
        if a.sequential or device.type == 'cuda':      # one model at a time (paper shapes do not all fit at once)
            benches = []
            for run in runs:
                b = Bench(run, micro(run), device)
                for i in range(a.warmup + a.steps): b.step(timed=i >= a.warmup)
                benches.append((b.row(), b)); b.free()
            measured = [r for r, _ in benches]
        else:                                           # interleaved rounds: load changes on a shared CPU hit every design alike
            benches = [Bench(run, micro(run), device) for run in runs]
            for i in range(a.warmup + a.steps):
                for b in benches: b.step(timed=i >= a.warmup)
            measured = [b.row() for b in benches]
        base = measured[0]['tokens_per_s']
        for row in measured:
            row['ratio_vs_preln'] = round(row['tokens_per_s'] / base, 3)
            rows.append(row); print(json.dumps(row), flush=True)
    print(f"\n{'arch':>14} {'L':>3} {'d':>5} {'tok/s':>10} {'vs preln':>9}" + ('  MFU' if 'mfu' in rows[0] else ''))
    for r in rows:
        print(f"{r['arch']:>14} {r['n_layer']:>3} {r['d_model']:>5} {r['tokens_per_s']:>10.1f} {r['ratio_vs_preln']:>9.3f}"
              + (f"  {r['mfu']:.3f}" if 'mfu' in r else ''))
    if a.json:
        with open(a.json, 'w') as f: json.dump(dict(device=str(device), preset=a.preset, rows=rows), f, indent=1)


if __name__ == '__main__':
    main()
