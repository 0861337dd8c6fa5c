"""The behaviour fixture: what the package computes, recorded so that a redesign can show it changed nothing.

`compute(data)` trains short tiny-preset runs of every design, their option variants and the looped model (losses,
gradient norms and validation losses per step), counts their parameters (closed form and instantiated), costs them
(training and prefill FLOPs, KV and depth cache, the cost-table row of the paper shape), lists the shape grids, the
looped grids and their accounting, and builds both reports' tables from records made here (the DepthBench report on
the short runs, the looped report on the 116 runs of `looped-main` with losses from the paper's law).

    .venv/bin/python tests/behaviour_fixture.py --record     # writes tests/data/behaviour_fixture.json

`tests/test_behaviour_fixture.py` recomputes it and compares value by value: integers and strings exactly, floats
within `CROSS_MACHINE_RTOL` (another CPU's kernels round differently: two AVX512 machines with torch 2.13.0 gave
1e-7 on the design runs' losses, 2e-6 on the looped runs' losses and 1.2e-4 on their gradient norms, which the bf16
Polar Express step of MuonH amplifies). Bit for bit needs the same numerics: `numerics_probe()` hashes a battery of plain torch
fp32 operations (no project code), and a machine whose probe has its own recording,
`tests/data/behaviour_fixture.<probe>.json`, is compared with it bit for bit, except the looped report's float64
scipy fits (`NUMPY_SECTIONS`), whose BLAS kernels the torch probe cannot see: those stay within `CROSS_MACHINE_RTOL`. Such a recording is made only from
code before the redesign (commit f5501bb, the commit that recorded the main fixture):

    .venv/bin/python tests/behaviour_fixture.py --record-environment   # writes tests/data/behaviour_fixture.<probe>.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

FIXTURE = Path(__file__).parent / "data" / "behaviour_fixture.json"
STEPS = 4
# every design at its defaults plus the option variants the paper studies (name, arch, options)
VARIANTS = [
    (a, a, {}) for a in ("preln", "periln", "lns", "deepnorm", "keel", "hc", "mhc", "attnres", "block_attnres", "moda")
] + [
    ("hc-unmixed", "hc", dict(hc_update="unmixed")),
    ("mhc-native", "mhc", dict(mhc_backend="native")),
    ("mhc-static", "mhc", dict(mhc_backend="static")),
    ("block_attnres-S2", "block_attnres", dict(attnres_block_size=2)),
    ("moda-no-ffn-kv", "moda", dict(moda_ffn_kv=False)),
    ("looped-r1", "looped", dict(r=1)),
    ("looped-r2", "looped", dict(r=2)),
    ("looped", "looped", {}),
    ("looped-additive", "looped", dict(injection="additive")),
    ("looped-passthrough", "looped", dict(injection="passthrough")),
    ("looped-hc", "looped", dict(injection="hc")),
    ("looped-tbptt", "looped", dict(truncated_bptt=True)),
]
# columns that measure the machine, not the computation
VOLATILE = (
    "wall",
    "time",
    "tok/s",
    "tokens_per_s",
    "mfu",
    "peak_mem",
    "provenance",
    "path",
    "folder",
    "host",
    "git",
    "version",
    "created",
    "started",
    "finished",
    "device",
    "gpu_hours",
    "cpu_s",
    "error",
    "traceback",
)


def _volatile(name: str) -> bool:
    return any(v in str(name).lower() for v in VOLATILE)


def _clean(obj):
    "JSON-able, with NaN/inf as strings (JSON has none) and machine-dependent fields dropped."
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items() if not _volatile(k)}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return repr(obj)
    return obj


def _run_config(arch: str, opts: dict):
    from depthbench_nb.run_params import make_run_config

    opts = dict(opts)
    shape = {} if arch == "looped" else dict(L=4 if arch == "block_attnres" else 2, d_model=32)
    # data=None: the tiny preset's offline corpus in the cache folder, prepared on first use; its path is not part of the
    # config, so run ids do not depend on where a test session keeps its files
    run = make_run_config(
        arch, preset="tiny", max_steps=STEPS, eval_every=2, study="behaviour", verbose=False, **shape, **opts
    )
    return run.replace(train=run.train.replace(seq_len=32, global_batch=4, eval_batches=1))


def _model_numbers(cfg) -> dict:
    from depthbench_nb import costs
    from depthbench_nb.model import build_model, n_params
    from depthbench_nb.shapes import count_params

    pc = count_params(cfg)
    out = dict(
        params_closed_form=pc.total,
        params_backbone=pc.backbone,
        params_instantiated=n_params(build_model(cfg, device="meta")),
        train_flops_per_token_2048=costs.train_flops_per_token(cfg, 2048),
        prefill_flops_4096=costs.prefill_flops(cfg, 4096),
        kv_cache_bytes_4096=costs.kv_cache_bytes(cfg, 4096),
        depth_cache_bytes_4096=costs.depth_cache_bytes(cfg, 4096),
    )
    return out


def _training() -> dict:
    from depthbench_nb.runs import read_metrics, read_result
    from depthbench_nb.runs import run_dir
    from depthbench_nb.trainer import train

    out = {}
    for name, arch, opts in VARIANTS:
        run = _run_config(arch, opts)
        res = train(run, progress=False)
        rows = read_metrics(run_dir(run))
        steps = [r for r in rows if "step" in r]
        out[name] = dict(
            run_id=run.run_id,
            status=res["status"],
            steps=res.get("steps"),
            loss=[r["loss"] for r in steps],
            grad_norm=[r["grad_norm"] for r in steps],
            lr=[r["lr"] for r in steps],
            val_loss=[r.get("val_loss") for r in steps],
            final_val_loss=read_result(run_dir(run)).get("final_val_loss"),
            **_model_numbers(run.model),
        )
    return out


def _paper_shapes() -> dict:
    "Closed-form counts and costs of every design on the paper grids, and the looped grids' accounting."
    from depthbench_nb import costs
    from depthbench_nb.config import ModelConfig
    from depthbench_nb.looped import looped_grid_rows
    from depthbench_nb.shapes import shape_for, shape_rows

    designs = [n for n, _, o in VARIANTS if not n.startswith("looped") and not o]
    out = {"shape_rows": {}, "cost_rows": {}, "looped_grids": {}}
    for grid in ("400m", "400m-main", "300m-backbone", "1.6b", "ladder"):
        for arch in designs:
            out["shape_rows"][f"{grid}/{arch}"] = shape_rows(grid, arch)
    for arch in designs:
        s = shape_for("400m", 24)
        cfg = ModelConfig(arch=arch, n_layer=s.n_layer, d_model=s.d_model, n_head=s.n_head, ffn_hidden=s.ffn_hidden)
        out["cost_rows"][arch] = costs.cost_row(cfg, seq_len=4096, train_seq_len=2048)
    for variant in ("baseline", "tbptt", "hc"):
        out["looped_grids"][variant] = looped_grid_rows(variant)
    return out


def _tables(folder: Path) -> dict:
    import pandas as pd

    out = {}
    for p in sorted(folder.glob("*.csv")):
        df = pd.read_csv(p)
        df = df[[c for c in df.columns if not _volatile(c)]]
        out[p.stem] = json.loads(df.to_json(orient="split", double_precision=15))
    return out


def _depthbench_report(tmp: Path) -> dict:
    from depthbench_nb.report_depthbench import build_depthbench_report

    build_depthbench_report("behaviour", out_dir=tmp / "depthbench-report")
    return _tables(tmp / "depthbench-report")


def _looped_report(tmp: Path) -> dict:
    "looped-main's 116 runs as its study plans them, losses from the looped paper's law with seeded noise."
    import numpy as np
    from depthbench_nb.looped import looped_grid_rows, looped_params
    from depthbench_nb.report_looped import build_looped_report
    from depthbench_nb.runs import provenance, run_dir, write_params, write_result
    from depthbench_nb.run_params import make_run_config

    law = dict(E=1.56773, A=28.027, B=915.82, alpha=0.19924, beta=0.36863, phi=0.459)
    rng = np.random.default_rng(0)
    for row in looped_grid_rows("baseline"):
        run = make_run_config(
            "looped", preset="looped", r=row["r"], s=row["s"], C=row["C"], study="looped-main", verbose=False
        )
        p = looped_params(run.model)
        loss = float(
            law["E"]
            + law["A"] * (p.n_once + run.model.recurrence ** law["phi"] * p.n_rec) ** -law["alpha"]
            + law["B"] * run.train.tokens ** -law["beta"]
            + 0.003 * rng.standard_normal()
        )
        folder = run_dir(run)
        folder.mkdir(parents=True, exist_ok=True)
        write_params(folder, run)
        write_result(
            folder,
            dict(
                status="completed",
                run_id=run.run_id,
                study=run.study,
                arch="looped",
                n_layer=run.model.n_layer,
                d_model=run.model.d_model,
                preset=run.preset,
                lr=run.train.lr,
                seed=run.train.seed,
                steps=run.train.tokens // (run.train.seq_len * run.train.global_batch),
                tokens=run.train.tokens,
                final_val_loss=loss,
                best_val_loss=loss,
                wall_time_s=0.0,
                train_flops=None,
                params_total=None,
                params_backbone=None,
                provenance=provenance(),
            ),
        )
    build_looped_report("looped-main", out_dir=tmp / "looped-report", restarts=24, n_bootstrap=0)
    return _tables(tmp / "looped-report")


def compute() -> dict:
    """Everything the fixture holds, computed now (run records go to a temporary runs folder; data to the cache folder).
    The runs take the reference depth-mixing path (DEPTHBENCH_MIXING=reference), the code the fixture recorded; the
    fused path rounds differently and is compared with it in tests/test_models.py (forward and gradients to 1e-6)."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        old = {k: os.environ.get(k) for k in ("DEPTHBENCH_RUNS", "DEPTHBENCH_MIXING")}
        os.environ.update(DEPTHBENCH_RUNS=str(tmp / "runs"), DEPTHBENCH_MIXING="reference")
        try:
            out = dict(
                cpu_capability=torch.backends.cpu.get_cpu_capability(),
                torch=torch.__version__,
                training=_training(),
                paper_shapes=_paper_shapes(),
                depthbench_report=_depthbench_report(tmp),
                looped_report=_looped_report(tmp),
            )
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return _clean(out)


# relative tolerance across machines: gradient norms / everything else (about 10x the differences measured)
CROSS_MACHINE_RTOL = dict(grad_norm=1e-3, other=1e-5)
# Sections computed by numpy/scipy in float64, not by torch: the looped report's Huber/L-BFGS-B fits. Their BLAS kernels
# are picked per CPU model (OpenBLAS dispatch), which the torch probe cannot see: on an AMD EPYC whose torch probe
# equals the recording machine's, the fits moved by up to 2.2e-7 relative. They are compared to CROSS_MACHINE_RTOL
# even where the rest is compared bit for bit.
NUMPY_SECTIONS = ("looped_report",)


def numerics_probe() -> str:
    "A hash of how this machine's torch rounds fp32 work like the fixture's (matmuls, softmax, norms, an AdamW step)."
    import hashlib
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 64, 96, generator=g)  # [B, T, d]
    w = torch.randn(96, 288, generator=g) / 96**0.5
    q, k, v = (x @ w).split(96, dim=-1)  # [B, T, d] each
    outs = [
        x @ w,
        torch.softmax(q @ k.transpose(1, 2) / 96**0.5, dim=-1) @ v,
        torch.nn.functional.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], is_causal=True),
        x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
        torch.nn.functional.layer_norm(x, (96,)),
        torch.nn.functional.silu(q) * k,
        torch.logsumexp(q, dim=-1),
        x.cumsum(1),
        torch.einsum("btd,bsd->bts", q, k),
    ]
    lin = torch.nn.Linear(96, 32)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(32, 96, generator=g) / 96**0.5)
        lin.bias.zero_()
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-3, weight_decay=0.1)
    for _ in range(2):
        loss = torch.nn.functional.cross_entropy(lin(x).flatten(0, 1), torch.arange(128) % 32)
        opt.zero_grad()
        loss.backward()
        opt.step()
    outs += [loss.detach(), lin.weight.detach()]
    h = hashlib.sha256(f"{torch.__version__} {torch.backends.cpu.get_cpu_capability()}".encode())
    for o in outs:
        h.update(o.contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


def environment_fixture() -> Path:
    "Where this machine's bit-for-bit recording lives (it may not exist)."
    return FIXTURE.with_name(f"behaviour_fixture.{numerics_probe()}.json")


def differences(recorded, now, exact: bool, path: str = "") -> list[str]:
    "Where `now` differs from `recorded`: exact for everything but floats, floats bit for bit or to `CROSS_MACHINE_RTOL`."
    if isinstance(recorded, dict) and isinstance(now, dict):
        out = [f"{path}/{k}: missing now" for k in recorded if k not in now]
        out += [f"{path}/{k}: new" for k in now if k not in recorded]
        for k in [k for k in recorded if k in now]:
            out += differences(recorded[k], now[k], exact, f"{path}/{k}")
        return out
    if isinstance(recorded, list) and isinstance(now, list):
        if len(recorded) != len(now):
            return [f"{path}: {len(recorded)} items recorded, {len(now)} now"]
        return [d for i, (a, b) in enumerate(zip(recorded, now)) for d in differences(a, b, exact, f"{path}[{i}]")]
    if isinstance(recorded, float) or isinstance(now, float):
        if (
            isinstance(recorded, bool)
            or isinstance(now, bool)
            or not isinstance(recorded, (int, float))
            or not isinstance(now, (int, float))
        ):
            return [f"{path}: {recorded!r} recorded, {now!r} now"]
        rtol = CROSS_MACHINE_RTOL["grad_norm" if "/grad_norm" in path else "other"]
        exact = exact and not path.startswith(tuple(f"/{s}" for s in NUMPY_SECTIONS))
        same = recorded == now if exact else math.isclose(recorded, now, rel_tol=rtol, abs_tol=1e-12)
        return [] if same else [f"{path}: {recorded!r} recorded, {now!r} now"]
    return [] if recorded == now else [f"{path}: {recorded!r} recorded, {now!r} now"]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--record",
        action="store_true",
        help=f"write {FIXTURE.relative_to(Path.cwd()) if FIXTURE.is_relative_to(Path.cwd()) else FIXTURE}",
    )
    ap.add_argument(
        "--record-environment",
        action="store_true",
        help="write this machine's bit-for-bit recording (only from code before the redesign)",
    )
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = compute()
    if a.record or a.record_environment:
        target = environment_fixture() if a.record_environment else FIXTURE
        target.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        print(f"recorded {target} ({target.stat().st_size:,} bytes)")
    else:
        diffs = differences(json.loads(FIXTURE.read_text()), result, exact=False)
        print("\n".join(diffs[:50]) or "no differences")
        sys.exit(1 if diffs else 0)
