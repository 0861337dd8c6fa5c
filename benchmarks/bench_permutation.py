"""Permutation score: the shared-prefix, batched evaluation against the plain swap-and-rerun loop, in one run.

    OMP_NUM_THREADS=1 python benchmarks/bench_permutation.py [--L 32] [--d-model 32] [--batch 4] [--seq-len 32] \
        [--arch preln]

Both methods evaluate all L(L-1)/2 swaps of a tiny-width model on the same windows; the script checks that they
agree and prints the wall and CPU time of each and their ratios (the baseline is measured in the same process;
on a shared machine the CPU-time ratio is the steadier figure).
"""

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from depthbench_nb.config import ModelConfig  # noqa: E402
from depthbench_nb.diagnostics import permutation_matrix  # noqa: E402
from depthbench_nb.model import build_model  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="preln")
    p.add_argument("--L", type=int, default=32)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--n-head", type=int, default=2)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    a = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = ModelConfig(
        arch=a.arch, n_layer=a.L, d_model=a.d_model, n_head=a.n_head, vocab_size=a.vocab, max_seq_len=max(64, a.seq_len)
    )
    model = build_model(cfg).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, a.vocab, (a.batch, a.seq_len), generator=g)
    y = torch.randint(0, a.vocab, (a.batch, a.seq_len), generator=g)
    times, cpu, results = {}, {}, {}
    for method in ("naive", "shared"):
        best, best_cpu = float("inf"), float("inf")
        for _ in range(a.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            P, base, used = permutation_matrix(model, x, y, method=method)
            best, best_cpu = min(best, time.perf_counter() - t0), min(best_cpu, time.process_time() - c0)
        times[method], cpu[method], results[method] = best, best_cpu, P
        assert used == method
    diff = float((results["naive"].nan_to_num() - results["shared"].nan_to_num()).abs().max())
    pairs = a.L * (a.L - 1) // 2
    print(
        f"arch={a.arch} L={a.L} d_model={a.d_model} batch={a.batch} seq_len={a.seq_len} pairs={pairs} "
        f"threads={torch.get_num_threads()}"
    )
    print(f"naive  (swap, full forward, swap back): wall {times['naive']:.2f} s, cpu {cpu['naive']:.2f} s")
    print(f"shared (prefix replayed, swaps batched): wall {times['shared']:.2f} s, cpu {cpu['shared']:.2f} s")
    print(
        f"speedup naive/shared: wall {times['naive'] / times['shared']:.2f}x, cpu {cpu['naive'] / cpu['shared']:.2f}x"
        f"   max |P_naive - P_shared| = {diff:.2e}"
    )
    assert diff < 1e-5, "the two methods disagree"
    if a.json:
        shape = dict(arch=a.arch, L=a.L, d_model=a.d_model, batch=a.batch, seq_len=a.seq_len, pairs=pairs)
        rows = [dict(method=m, wall_s=times[m], cpu_s=cpu[m]) for m in ("naive", "shared")]
        ratios = dict(wall=times["naive"] / times["shared"], cpu=cpu["naive"] / cpu["shared"])
        Path(a.json).write_text(json.dumps(dict(shape=shape, rows=rows, naive_over_shared=ratios, max_diff=diff)))


if __name__ == "__main__":
    main()
