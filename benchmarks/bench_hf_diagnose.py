"""Diagnostics of a Transformers model: the batched perturbed forwards against one plain forward each, in one run.

    OMP_NUM_THREADS=1 python benchmarks/bench_hf_diagnose.py [--family llama] [--L 16] [--d-model 64] \
        [--batch 4] [--seq-len 64]

Builds a random-weight model of a Transformers family from its config (no download), then runs each perturbing
diagnostic (causal score with pruning, angular-distance pruning, permutation score) with `method='naive'` (the plain
loop of depthbench_nb.diagnostics: one forward per perturbation, weights swapped in place) and `method='shared'`
(BatchedRuns: variants batched, each computed from its first change on), checks that they agree and prints the wall
and CPU time of each and their ratios (the baseline is measured in the same process; on a shared machine the CPU-time
ratio is the steadier figure).
"""

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, GPT2Config, GPTNeoXConfig, LlamaConfig, Qwen2Config  # noqa: E402

from depthbench_nb.hf_diagnostics import HFDepthModel, diagnose_hf_model  # noqa: E402

GROUPS = {"causal+pruning": lambda L: L, "angular_pruning": lambda L: L - 1, "permutation": lambda L: L * (L - 1) // 2}


def build(family: str, L: int, d: int, vocab: int):
    common = dict(vocab_size=vocab, initializer_range=0.1)
    if family == "gpt2":
        cfg = GPT2Config(n_embd=d, n_layer=L, n_head=max(1, d // 16), n_positions=1024, **common)
    else:
        cls = dict(llama=LlamaConfig, qwen2=Qwen2Config, gpt_neox=GPTNeoXConfig)[family]
        cfg = cls(
            hidden_size=d,
            num_hidden_layers=L,
            num_attention_heads=max(1, d // 16),
            intermediate_size=4 * d,
            max_position_embeddings=1024,
            **common,
        )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).eval()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="llama", choices=["llama", "qwen2", "gpt_neox", "gpt2"])
    p.add_argument("--L", type=int, default=16)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    a = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model = HFDepthModel(build(a.family, a.L, a.d_model, a.vocab))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, a.vocab, (a.batch, a.seq_len), generator=g)
    y = torch.randint(0, a.vocab, (a.batch, a.seq_len), generator=g)
    print(
        f"family={a.family} L={a.L} d_model={a.d_model} batch={a.batch} seq_len={a.seq_len} "
        f"threads={torch.get_num_threads()}"
    )

    def mat(rows):
        return torch.tensor([[0.0 if v is None else v for v in r] for r in rows])

    total = {"naive": [0.0, 0.0], "shared": [0.0, 0.0]}
    rows = []
    for group, forwards in GROUPS.items():
        metrics = group.split("+")
        times, results = {}, {}
        for method in ("naive", "shared"):
            best = (float("inf"), float("inf"))
            for _ in range(a.repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                res = diagnose_hf_model(model, x, y, metrics, method=method)
                best = min(best, (time.perf_counter() - t0, time.process_time() - c0))
            assert res["method"] == method
            times[method], results[method] = best, res
            total[method] = [total[method][0] + best[0], total[method][1] + best[1]]
        key = metrics[0]
        if key == "angular_pruning":
            diff = max(
                abs(p["loss"] - q["loss"])
                for p, q in zip(results["naive"][key]["curve"], results["shared"][key]["curve"])
            )
        else:
            diff = float((mat(results["naive"][key]["matrix"]) - mat(results["shared"][key]["matrix"])).abs().max())
        n, s = times["naive"], times["shared"]
        print(
            f"{group:<16} {forwards(a.L):>4} perturbed forwards: naive wall {n[0]:6.2f} s cpu {n[1]:6.2f} s | "
            f"shared wall {s[0]:6.2f} s cpu {s[1]:6.2f} s | "
            f"naive/shared wall {n[0] / s[0]:.2f}x cpu {n[1] / s[1]:.2f}x | max diff {diff:.1e}"
        )
        assert diff < 1e-4, "the two methods disagree"
        rows.append(
            dict(
                group=group,
                forwards=forwards(a.L),
                naive_wall_s=n[0],
                naive_cpu_s=n[1],
                shared_wall_s=s[0],
                shared_cpu_s=s[1],
                wall_ratio=n[0] / s[0],
                cpu_ratio=n[1] / s[1],
                max_diff=diff,
            )
        )
    n, s = total["naive"], total["shared"]
    print(
        f"{'all':<16} {sum(f(a.L) for f in GROUPS.values()):>4} perturbed forwards: "
        f"naive wall {n[0]:6.2f} s cpu {n[1]:6.2f} s | "
        f"shared wall {s[0]:6.2f} s cpu {s[1]:6.2f} s | naive/shared wall {n[0] / s[0]:.2f}x cpu {n[1] / s[1]:.2f}x"
    )
    if a.json:
        shape = dict(family=a.family, L=a.L, d_model=a.d_model, batch=a.batch, seq_len=a.seq_len)
        ratios = dict(wall=n[0] / s[0], cpu=n[1] / s[1])
        Path(a.json).write_text(json.dumps(dict(shape=shape, rows=rows, naive_over_shared=ratios)))


if __name__ == "__main__":
    main()
