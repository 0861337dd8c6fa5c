"""Greedy decoding throughput with the KV cache (`depthbench_nb.interop.decode_throughput`) of every design relative
to Pre-LN, measured in one run — the decode-latency input of the diagnostics' cost figures.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_decode.py                      # CPU, tiny shape (~30 s)
    .venv/bin/python benchmarks/bench_decode.py --shape 400m --depths 16,24,32 --device cuda   # paper grid, fp32

For each (design, depth): prefill tokens/s, decode tokens/s (batch x new tokens / decode seconds, best of --repeats)
and KV-cache bytes after decoding; `decode_vs_preln` is the design's decode tokens/s over Pre-LN's at the same depth.
A benchmark, not a test: nothing is asserted. --out writes the rows as JSON.
"""

from __future__ import annotations

import argparse

import torch

from depthbench_nb.config import ModelConfig, atomic_write_json
from depthbench_nb.interop import decode_throughput
from depthbench_nb.model import build_model
from depthbench_nb.shapes import shape_for

DESIGNS = ["preln", "periln", "lns", "deepnorm", "keel", "moda", "hc", "mhc", "attnres", "block_attnres"]


def model_config(shape: str, arch: str, L: int) -> ModelConfig:
    if shape == "400m":
        return shape_for("400m", L).model_config(arch)
    return ModelConfig(arch=arch, n_layer=L, d_model=64, n_head=4, vocab_size=256, max_seq_len=256)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=["tiny", "400m"], default="tiny")
    p.add_argument("--depths", default=None, help="comma-separated L (default: 8 for tiny, 24 for 400m)")
    p.add_argument("--designs", default=",".join(DESIGNS))
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 64 tiny, 512 400m)")
    p.add_argument("--new", type=int, default=None, help="decoded tokens (default 32 tiny, 128 400m)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    a = p.parse_args(argv)
    depths = [int(x) for x in (a.depths or ("8" if a.shape == "tiny" else "24")).split(",")]
    prompt = a.prompt or (64 if a.shape == "tiny" else 512)
    new = a.new or (32 if a.shape == "tiny" else 128)
    designs = a.designs.split(",")
    if "preln" not in designs:
        designs = ["preln"] + designs  # the baseline of the ratio
    rows = []
    for L in depths:
        base = None
        for arch in designs:
            model = build_model(model_config(a.shape, arch, L), seed=0).to(a.device)
            r = decode_throughput(model, a.batch, prompt, new, repeats=a.repeats)
            base = base or r["decode_tokens_per_s"]
            r["decode_vs_preln"] = r["decode_tokens_per_s"] / base
            rows.append(r)
            print(
                f"L{L:<3} {arch:14s} prefill {r['prefill_tokens_per_s']:10.1f} tok/s  "
                f"decode {r['decode_tokens_per_s']:8.1f} tok/s"
                f"  x{r['decode_vs_preln']:.2f} vs preln  KV {r['kv_cache_bytes'] / 2**20:8.2f} MiB",
                flush=True,
            )
            del model
            if a.device.startswith("cuda"):
                torch.cuda.empty_cache()
    if a.out:
        atomic_write_json(a.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
