"""The kernel test harness: every Triton kernel (and tiny models of every design using them) against its torch
reference in Triton's CPU interpreter, in a fresh process (the interpreter has to be on before the kernels are
decorated). Used by tests/test_kernels.py and the kernels notebook; it builds models, so it lives here and not in
`depthbench_nb.kernels` (which comes before the model in the import flow)."""

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from depthbench_nb.config import ConfigError
from depthbench_nb.kernels import (
    _FUSED_CHECKS,
    HAS_TRITON,
    _KERNEL_NAMES,
    _KERNELS_ENV,
    _TRITON_INTERPRETED,
    _use_triton,
    _compare_to_reference,
    _kernel_example,
)

HERE = Path(__file__).resolve().parent


DEFAULT_INTERPRETER_CASES = tuple(dict(kernel=k) for k in _KERNEL_NAMES)


def _interpreter_worker() -> None:
    "Body of the interpreter subprocess: read cases (JSON on stdin), print {case index: errors} as JSON."
    import json
    import sys
    import time

    if not _TRITON_INTERPRETED:
        raise RuntimeError("the interpreter worker needs TRITON_INTERPRET=1 before import")
    results = []
    for case in json.load(sys.stdin):
        t0 = time.perf_counter()
        if "model" in case:
            results.append(
                dict(case=case, errors=_model_kernels_vs_torch(case), dispatched=True, seconds=time.perf_counter() - t0)
            )
            continue
        if "fused" in case:  # a fused kernel against its torch twin (depthbench_nb.kernels._FUSED_CHECKS)
            errs = _FUSED_CHECKS[case["fused"]]("cpu", **case.get("example", {}))
            results.append(
                dict(
                    case=case,
                    errors=errs,
                    dispatched=_use_triton(case["fused"], torch.ones(1)),
                    seconds=time.perf_counter() - t0,
                )
            )
            continue
        example = {
            k: (getattr(torch, v) if k in ("dtype", "dtype2") else v) for k, v in case.get("example", {}).items()
        }
        args, kwargs = _kernel_example(case["kernel"], **example)
        errs = _compare_to_reference(case["kernel"], args, kwargs, case.get("outputs"))
        # the public function dispatches to the kernel (DEPTHBENCH_KERNELS=triton) on CPU tensors
        dispatched = _use_triton(case["kernel"], *[a for a in args if isinstance(a, Tensor)])
        results.append(dict(case=case, errors=errs, dispatched=dispatched, seconds=time.perf_counter() - t0))
    print("INTERPRETER-REPORT " + json.dumps(results))


def _model_kernels_vs_torch(case: dict) -> dict[str, float]:
    "A tiny model of `case['model']` trained one step's worth (loss, gradients) with the kernels and with torch."
    from depthbench_nb.config import ModelConfig
    from depthbench_nb.model import build_model

    cfg = ModelConfig(
        arch=case["model"],
        n_layer=case.get("n_layer", 1),
        d_model=32,
        n_head=2,
        vocab_size=64,
        max_seq_len=8,
        **case.get("options", {}),
    )
    idx = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(0))  # [B, T]
    runs = {}
    for backend in ("torch", "triton"):
        os.environ[_KERNELS_ENV] = backend
        model = build_model(cfg, seed=0)
        model.mixing = case.get("mixing")  # None: DEPTHBENCH_MIXING (fused)
        logits = model(idx)  # [B, T, V]
        loss = F.cross_entropy(logits.flatten(0, 1), idx.flatten())
        loss.backward()
        runs[backend] = (logits.detach(), {k: p.grad for k, p in model.named_parameters() if p.grad is not None})
    os.environ[_KERNELS_ENV] = "triton"
    (lt, gt), (lk, gk) = runs["torch"], runs["triton"]
    if set(gt) != set(gk):
        return dict(grad_names=float("inf"))
    # gradients relative to each parameter's own scale, floored at 1e-4 of the largest gradient: parameters whose
    # gradient is pure rounding noise (e.g. mhc_static's gap-8 logits, ~1e-13) must not dominate the verdict
    floor = 1e-4 * max(g.abs().max().item() for g in gt.values())
    errs = dict(logits=((lk - lt).abs().max() / lt.abs().max()).item())
    errs["grads"] = max(((gk[k] - gt[k]).abs().max() / max(gt[k].abs().max().item(), floor)).item() for k in gt)
    return errs


def interpreter_report(cases=DEFAULT_INTERPRETER_CASES, timeout: float = 300.0) -> list[dict]:
    "Run kernel-vs-reference cases in a subprocess with Triton's CPU interpreter; one dict per case (errors, seconds)."
    import json
    import subprocess
    import sys

    if not HAS_TRITON:
        raise ConfigError("interpreter_report needs triton installed (pip install triton)")
    env = dict(os.environ, TRITON_INTERPRET="1", **{_KERNELS_ENV: "triton"})
    code = (
        f"import sys; sys.path.insert(0, {str(HERE)!r}); "
        "from kernel_harness import _interpreter_worker; _interpreter_worker()"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(list(cases)),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("INTERPRETER-REPORT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"interpreter subprocess failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("INTERPRETER-REPORT ") :])
