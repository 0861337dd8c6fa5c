"""The behaviour fixture: what the package computes, recorded so that a redesign can show it changed nothing.

`compute()` trains short tiny-preset runs of every registered design, the option variants the papers study and the
looped model (losses, gradient norms and validation losses per step), counts their parameters (closed form and
instantiated), costs them (training and prefill FLOPs, KV and depth cache, the cost-table row of the paper shape), lists
the shape grids, the looped grids and their accounting, and builds both reports' tables from records made here (the
DepthBench report on the short runs, the looped report on the 116 runs of `looped-main` with losses from the paper's
law).

The recording is keyed per design (`by_design`): `designs.<name>` holds everything of one design (its runs, shape rows,
cost row and its rows of the report tables; the looped model's entry also holds its grids and the looped report), and
`shared` the report tables that belong to no design. A new design adds its own entry and leaves the recorded ones
alone: until it is recorded the comparison reports it as not recorded yet, with the command that records it:

    .venv/bin/python tests/behaviour_fixture.py                        # compare; list designs not recorded yet
    .venv/bin/python tests/behaviour_fixture.py --record-design NAME   # add NAME's entry to the recordings

`--record-design` refuses while a recorded entry differs, and re-records only the shared tables that summarise all
designs (`DESIGN_SPANNING`: the paper index, the run count, the verdicts), which a new design changes by existing.

`tests/test_behaviour_fixture.py` recomputes it and compares value by value: integers and strings exactly, floats
within `CROSS_MACHINE_RTOL` (another CPU's kernels round differently: two AVX512 machines with torch 2.13.0 gave
1e-7 on the design runs' losses, 2e-6 on the looped runs' losses and 1.2e-4 on their gradient norms, which the bf16
Polar Express step of MuonH amplifies). Bit for bit needs the same numerics: `numerics_probe()` hashes a battery of
plain torch fp32 operations (no project code), and a machine whose probe has its own recording,
`tests/data/behaviour_fixture.<probe>.json`, is compared with it bit for bit, except the looped report's float64
scipy fits (`NUMPY_SECTIONS`), whose BLAS kernels the torch probe cannot see: those stay within `CROSS_MACHINE_RTOL`.
Both recordings were made from code before the redesign (commit f5501bb) in one flat layout and converted to the keyed
one without changing a value (`flat_layout` gives the flat files back byte for byte; `FLAT_RECORDINGS` holds their
hashes). A machine's own recording of all designs is made from such code:

    .venv/bin/python tests/behaviour_fixture.py --record-environment  # tests/data/behaviour_fixture.<probe>.json
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib
import json
import math
import os
import sys
import tempfile
from pathlib import Path

FIXTURE = Path(__file__).parent / "data" / "behaviour_fixture.json"
STEPS = 4
# the option variants the papers study (name, arch, options); every registered design also runs at its defaults
OPTION_VARIANTS = [
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


def residual_designs() -> list[str]:
    "The registered designs on the DepthBench backbone (every one but the looped model), in registry order."
    from depthbench_nb.config import ARCHS

    for module in ("depthbench_nb.model", "depthbench_nb.looped"):
        importlib.import_module(module)  # importing a design's module registers it

    return [a for a in ARCHS if a != "looped"]


def variants() -> list[tuple[str, str, dict]]:
    "Every residual design at its defaults, then the option variants: (name, arch, options)."
    return [(a, a, {}) for a in residual_designs()] + OPTION_VARIANTS


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
    # data=None: the tiny preset's offline corpus in the cache folder, prepared on first use; its path is not part of
    # the config, so run ids do not depend on where a test session keeps its files
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
    for name, arch, opts in variants():
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

    designs = residual_designs()
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
    from depthbench_nb.run_params import make_run_config
    from looped_records import write_looped_record

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
        write_looped_record(run, loss, note=None)
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
NUMPY_SECTIONS = ("designs/looped/looped_report",)


def numerics_probe() -> str:
    "A hash of how this machine's torch rounds fp32 work like the fixture's (matmuls, softmax, norms, an AdamW step)."
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
    "Where `now` differs from `recorded`: exact but for floats, which are bit for bit or within `CROSS_MACHINE_RTOL`."
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


# The DepthBench report's tables with a row per design (their `arch` column) are split into the designs' entries; the
# shared tables that summarise all designs change when a design is added, by the new design's existence alone.
DESIGN_COLUMN = "arch"
DESIGN_SPANNING = ("depthbench_paper_index", "depthbench_run_status", "depthbench_verdicts")
RECORD_DESIGN = ".venv/bin/python tests/behaviour_fixture.py --record-design"
# sha256 of the two recordings as they were written in the flat layout of `compute()`, before they were keyed per
# design: `flat_layout` of the keyed files must give these bytes back
FLAT_RECORDINGS = {
    "behaviour_fixture.json": "60c4f91c959bc5a4d3375f7b30216845345d24aaa2566a76eee6e7001abacf42",
    "behaviour_fixture.d8666b2b557d.json": "32a71150e263b658b2c23a4687a731baf0d6311a59996c9199cc36dd2fd98024",
}


def dump(data: dict) -> str:
    "A recording's text (the flat files were written so too)."
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def by_design(flat: dict) -> dict:
    "`compute()`'s flat layout keyed per design: `environment`, `designs.<name>` (all of one design), `shared`."
    arch_of = {name: arch for name, arch, _ in variants()}
    designs: dict[str, dict] = {}
    for name, run in flat["training"].items():
        designs.setdefault(arch_of[name], {}).setdefault("training", {})[name] = run
    for key, rows in flat["paper_shapes"]["shape_rows"].items():
        grid, arch = key.split("/")
        designs.setdefault(arch, {}).setdefault("shape_rows", {})[grid] = rows
    for arch, row in flat["paper_shapes"]["cost_rows"].items():
        designs.setdefault(arch, {})["cost_row"] = row
    designs.setdefault("looped", {}).update(
        looped_grids=flat["paper_shapes"]["looped_grids"], looped_report=flat["looped_report"]
    )
    shared = {}
    for name, table in flat["depthbench_report"].items():
        if DESIGN_COLUMN not in table["columns"]:
            shared[name] = table
            continue
        shared[name] = dict(columns=table["columns"], index=[], data=[])  # its rows go to their designs
        column = table["columns"].index(DESIGN_COLUMN)
        for position, row in zip(table["index"], table["data"]):
            rows = designs.setdefault(row[column], {}).setdefault("depthbench_report", {})
            rows = rows.setdefault(name, dict(index=[], data=[]))
            rows["index"].append(position)
            rows["data"].append(row)
    environment = dict(cpu_capability=flat["cpu_capability"], torch=flat["torch"])
    return dict(environment=environment, designs=designs, shared=dict(depthbench_report=shared))


def flat_layout(keyed: dict) -> dict:
    "The inverse of `by_design`: the layout `compute()` returns (the report rows in their recorded positions)."
    designs = keyed["designs"]
    report = {}
    for name, table in keyed["shared"]["depthbench_report"].items():
        rows = list(zip(table["index"], table["data"]))
        for entry in designs.values():
            mine = entry.get("depthbench_report", {}).get(name)
            rows += list(zip(mine["index"], mine["data"])) if mine else []
        rows.sort(key=lambda position_row: position_row[0])
        report[name] = dict(columns=table["columns"], index=[i for i, _ in rows], data=[row for _, row in rows])
    shape_rows = {
        f"{grid}/{arch}": rows for arch, e in designs.items() for grid, rows in e.get("shape_rows", {}).items()
    }
    return dict(
        keyed["environment"],
        training={name: run for e in designs.values() for name, run in e.get("training", {}).items()},
        paper_shapes=dict(
            shape_rows=shape_rows,
            cost_rows={arch: e["cost_row"] for arch, e in designs.items() if "cost_row" in e},
            looped_grids=designs["looped"]["looped_grids"],
        ),
        depthbench_report=report,
        looped_report=designs["looped"]["looped_report"],
    )


def _positionless(entry: dict) -> dict:
    "A design's entry without the positions of its report rows (a new design's rows move them)."
    tables = {name: table["data"] for name, table in entry.get("depthbench_report", {}).items()}
    return dict(entry, depthbench_report=tables) if tables else entry


def _recorded_columns(recorded: dict, now: dict) -> tuple[dict, list[str]]:
    """`now` with each report table cut to the columns the recording has, and the notes saying what was added since:
    a column added to a table, or a table added to the looped report, is new behaviour beside the recorded one (the
    recorded columns and tables are still compared value by value; a column or table gone is still a difference)."""
    now, notes = copy.deepcopy(now), []

    def cut(rec_cols: list, table: dict, rows: list, path: str) -> list:
        cols = table["columns"]
        if cols == rec_cols or not set(rec_cols) <= set(cols):
            return []
        keep = [cols.index(c) for c in rec_cols]
        for r in rows:
            r["data"] = [[row[i] for i in keep] for row in r["data"]]
        table["columns"] = list(rec_cols)
        return [f"{path}: column(s) added since the recording, not compared: {sorted(set(cols) - set(rec_cols))}"]

    shared = now["shared"]["depthbench_report"]
    for name, table in recorded["shared"]["depthbench_report"].items():
        if name in shared:
            rows = [shared[name]] + [
                e["depthbench_report"][name] for e in now["designs"].values() if name in e.get("depthbench_report", {})
            ]
            notes += cut(table["columns"], shared[name], rows, f"/depthbench_report/{name}")
    looped, looped_now = recorded["designs"].get("looped", {}), now["designs"].get("looped", {})
    for name in list(looped_now.get("looped_report", {})):
        table = looped_now["looped_report"][name]
        if name not in looped.get("looped_report", {}):
            notes.append(f"/designs/looped/looped_report/{name}: a table added since the recording, not compared")
            del looped_now["looped_report"][name]
        elif isinstance(table, dict) and "columns" in table:
            notes += cut(looped["looped_report"][name]["columns"], table, [table], f"/looped_report/{name}")
    return now, notes


def compare(recorded: dict, now: dict, exact: bool) -> tuple[list[str], list[str]]:
    """(differences, notes) of two keyed recordings. Each recorded design is compared with its entry now; a design
    not recorded yet is a note naming the command that records it, and so is a change of a shared table that
    summarises all designs (`DESIGN_SPANNING`) while such a design exists, and a report column or looped table added
    since the recording (`_recorded_columns`)."""
    now, added = _recorded_columns(recorded, now)
    new = [name for name in now["designs"] if name not in recorded["designs"]]
    notes = added + [f"design {name!r}: not recorded yet: record with {RECORD_DESIGN} {name}" for name in new]
    diffs = []
    for name, entry in recorded["designs"].items():
        if name not in now["designs"]:
            diffs.append(f"/designs/{name}: missing now")
            continue
        diffs += differences(_positionless(entry), _positionless(now["designs"][name]), exact, f"/designs/{name}")
    tables, tables_now = recorded["shared"]["depthbench_report"], now["shared"]["depthbench_report"]
    diffs += [f"/shared/depthbench_report/{name}: new" for name in tables_now if name not in tables]
    for name, table in tables.items():
        path = f"/shared/depthbench_report/{name}"
        found = differences(table, tables_now[name], exact, path) if name in tables_now else [f"{path}: missing now"]
        if found and new and name in DESIGN_SPANNING:
            notes.append(f"{path} summarises all designs and changed with {', '.join(new)}: recorded with them")
        else:
            diffs += found
    return diffs, notes


def recordings() -> list[tuple[Path, bool]]:
    "The recordings this machine compares with: (path, bit for bit)."
    return [(FIXTURE, False)] + ([(environment_fixture(), True)] if environment_fixture().exists() else [])


def record_design(name: str) -> None:
    "Add one design's entry to the recordings, after checking that every recorded entry still holds."
    now = by_design(compute())
    if name not in now["designs"]:
        sys.exit(f"no design {name!r} here; the designs: {', '.join(now['designs'])}")
    keyed = {path: json.loads(path.read_text()) for path, _ in recordings()}
    for path, exact in recordings():
        if name in keyed[path]["designs"]:
            sys.exit(f"{name!r} is recorded in {path.name} already; a recorded entry is not re-recorded")
        diffs, _ = compare(keyed[path], now, exact)
        if diffs:
            sys.exit(f"{len(diffs)} differences from {path.name}, e.g. {diffs[0]}: not recording while they exist")
    for path, recorded in keyed.items():
        recorded["designs"][name] = now["designs"][name]
        for table in DESIGN_SPANNING:
            recorded["shared"]["depthbench_report"][table] = now["shared"]["depthbench_report"][table]
        path.write_text(dump(recorded))
        print(f"recorded {name!r} in {path}")


def _arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--record",
        action="store_true",
        help=f"write {FIXTURE.relative_to(Path.cwd()) if FIXTURE.is_relative_to(Path.cwd()) else FIXTURE}, all designs",
    )
    ap.add_argument(
        "--record-environment",
        action="store_true",
        help="write this machine's bit-for-bit recording (only from code before the redesign)",
    )
    ap.add_argument("--record-design", metavar="NAME", help="add the entry of a design not recorded yet")
    return ap.parse_args()


if __name__ == "__main__":
    a = _arguments()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if a.record_design:
        record_design(a.record_design)
        sys.exit(0)
    result = by_design(compute())
    if a.record or a.record_environment:
        target = environment_fixture() if a.record_environment else FIXTURE
        target.write_text(dump(result))
        print(f"recorded {target} ({target.stat().st_size:,} bytes)")
    else:
        diffs, notes = compare(json.loads(FIXTURE.read_text()), result, exact=False)
        print("\n".join(diffs[:50] + notes) or "no differences")
        sys.exit(1 if diffs else 0)
