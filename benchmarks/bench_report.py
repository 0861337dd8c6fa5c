"""The DepthBench report on a full study: costs read from result.json summaries vs parsed from every metrics line.

Records: 840 completed runs at the 400m grid (10 designs x 7 shapes x 4 LRs x 3 seeds, 7,600 steps each), written
as the trainer writes them: params.json, result.json and a metrics.jsonl of a header and 7,600 step rows (step,
loss, lr, grad_norm, tokens, tokens_per_s, peak_mem_bytes, mfu; a val_loss every 250 steps). Two studies share the
same metrics files (hard links):

  bench-report-new : result.json has the trainer's summaries (peak_mem_bytes, tokens_per_s_median): the report reads
                     one small file per run;
  bench-report-old : records made before the trainer wrote them: the report parses every metrics line.

Timed, in the same run and process, for each study: the read path alone (`study_table` + the measured-costs table,
`_measured_costs_table`) and, unless --read-only, the whole report (`build_depthbench_report`, every table and
figure). The figures are wall-clock seconds; on a shared machine the neighbours' load inflates both sides, and the
ratio old / new measured in one run is the robust figure. The target: the whole report of bench-report-new in at
most 15 s on this project's 2-core machine.

The records take about 1.3 GB (the metrics, stored once). They are generated on the first run into --root (default
/tmp/bench-report-runs) and reused after (a marker file holds what was generated); --regenerate writes them again.

Run:  OMP_NUM_THREADS=1 python benchmarks/bench_report.py                (first run: + ~1-2 min to generate)
      OMP_NUM_THREADS=1 python benchmarks/bench_report.py --runs 84 --steps 760   (a quick look, 1/100 of the lines)
"""

import argparse
import json
import os
import random
import shutil
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

NEW, OLD = "bench-report-new", "bench-report-old"
DESIGNS = ("preln", "periln", "lns", "deepnorm", "keel", "hc", "mhc", "attnres", "block_attnres", "moda")
LRS = (1e-3, 2e-3, 4e-3, 8e-3)
SEEDS = (0, 1, 2)


def plan(n_runs: int) -> list:
    "The first `n_runs` of designs x 400m shapes x LRs x seeds (840 in all)."
    from depthbench_nb.shapes import grid_shapes

    Ls = [s.n_layer for s in grid_shapes("400m")]
    cells = [(a, L, lr, seed) for a in DESIGNS for L in Ls for lr in LRS for seed in SEEDS]
    if n_runs > len(cells):
        raise SystemExit(f"--runs at most {len(cells)}")
    return cells[:n_runs]


def metrics_text(run, steps: int, rng: random.Random) -> tuple[str, int, float]:
    "A metrics.jsonl as the trainer writes it; returns it with its peak memory and median tokens/s."
    from statistics import median

    from depthbench_nb.runs import metrics_header

    tok_step = run.train.global_batch * run.train.seq_len
    base_tps, base_mem = rng.uniform(2e5, 6e5), rng.randrange(20, 70) * 2**30
    lines, tps_all, peak = [json.dumps(metrics_header(run))], [], 0
    for i in range(steps):
        tps, mem = base_tps * rng.uniform(0.95, 1.05), base_mem + rng.randrange(0, 2**24)
        row = dict(
            step=i,
            loss=2.7 + 8.0 / (1 + i / 50) + rng.gauss(0, 0.01),
            lr=run.train.lr * min(1.0, (i + 1) / 760),
            grad_norm=abs(rng.gauss(0.5, 0.1)),
            tokens=(i + 1) * tok_step,
            tokens_per_s=tps,
            peak_mem_bytes=mem,
            mfu=tps * 6 * 4e8 / 9.89e14,
        )
        if i % 250 == 249:
            row["val_loss"] = row["loss"] + 0.02
        lines.append(json.dumps(row))
        tps_all.append(tps)
        peak = max(peak, mem)
    return "\n".join(lines) + "\n", peak, median(tps_all)


def generate(root: Path, n_runs: int, steps: int) -> None:
    "Both studies' records under `root` (the metrics written once, hard-linked into the old study)."
    from depthbench_nb.run_params import make_run_config
    from depthbench_nb.runs import provenance, result_identity, run_dir, write_params, write_result

    t0, rng = time.time(), random.Random(0)
    for i, (arch, L, lr, seed) in enumerate(plan(n_runs)):
        text = None
        for study in (NEW, OLD):
            run = make_run_config(
                arch, L=L, preset="400m", study=study, lr=lr, seed=seed, max_steps=steps, verbose=False
            )
            folder = run_dir(run)
            folder.mkdir(parents=True, exist_ok=True)
            write_params(folder, run, say=lambda _: None)
            if text is None:
                text, peak, tps = metrics_text(run, steps, rng)
                (folder / "metrics.jsonl").write_text(text)
                first = folder / "metrics.jsonl"
            else:
                os.link(first, folder / "metrics.jsonl")
            loss = 2.7 + 0.02 * abs(L - 24) / 8 + 0.01 * abs(lr / 2e-3 - 1) + rng.gauss(0, 0.005)
            summaries = dict(peak_mem_bytes=peak, tokens_per_s_median=tps) if study == NEW else {}
            write_result(
                folder,
                dict(
                    status="completed",
                    **result_identity(run),
                    steps=steps,
                    tokens=steps * run.train.global_batch * run.train.seq_len,
                    final_val_loss=loss,
                    best_val_loss=loss,
                    wall_time_s=steps * 2.0,
                    train_flops=None,
                    params_total=None,
                    params_backbone=None,
                    world_size=8,
                    provenance=dict(provenance(), note="bench_report.py: generated records"),
                    **summaries,
                ),
            )
        if (i + 1) % 84 == 0:
            print(f"  generated {i + 1}/{n_runs} runs ({time.time() - t0:.0f} s)", flush=True)


def du_bytes(path: Path) -> int:
    "Bytes on disk under `path`, a hard-linked file counted once."
    seen, total = set(), 0
    for p in path.rglob("*"):
        if p.is_file():
            st = p.stat()
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def read_path(study: str, out: Path) -> float:
    "Seconds of the report's read path: the study's run table and the measured-costs table."
    from depthbench_nb import report_common as rc
    from depthbench_nb import report_depthbench as rd

    def go():
        df = rc.study_table(study)
        rep = rc.Report(study, "depthbench", rc.study_scale(df, study), out)
        rd._measured_costs_table(rep, rc.completed(df))
        return rep

    return timed(go)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="/tmp/bench-report-runs", help="where the records are (generated once)")
    ap.add_argument("--runs", type=int, default=840)
    ap.add_argument("--steps", type=int, default=7600)
    ap.add_argument("--regenerate", action="store_true", help="write the records again")
    ap.add_argument("--read-only", action="store_true", help="time the read path only, not the whole report")
    a = ap.parse_args()
    root = Path(a.root)
    os.environ["DEPTHBENCH_RUNS"] = str(root)
    marker, want = root / "bench_report.json", dict(runs=a.runs, steps=a.steps, version=1)
    if a.regenerate or not marker.exists() or json.loads(marker.read_text()) != want:
        need = a.runs * a.steps * 200
        free = shutil.disk_usage(root.parent if not root.exists() else root).free
        print(
            f"generating {a.runs} runs x {a.steps} steps into {root} "
            f"(about {need / 1e9:.1f} GB; free {free / 1e9:.0f} GB)"
        )
        if need > free * 0.8:
            raise SystemExit("not enough free disk: choose another --root")
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        generate(root, a.runs, a.steps)
        marker.write_text(json.dumps(want))
    print(f"records: {a.runs} runs x {a.steps:,} metric lines per study; {du_bytes(root) / 1e9:.2f} GB on disk")

    from depthbench_nb.report_depthbench import build_depthbench_report

    out = root / "_reports"
    import pandas as pd

    build_depthbench_report("warm-up", df=pd.DataFrame(), out_dir=out / "warm-up")  # imports, fonts: timed by neither
    rows = []
    for study, what in ((NEW, "summaries in result.json"), (OLD, "every metrics line parsed")):
        read_s = read_path(study, out / f"{study}-read")
        full_s = (
            None if a.read_only else timed(lambda: build_depthbench_report(study, out_dir=out / study, related=[]))[0]
        )
        rows.append((study, what, read_s, full_s))
    print()
    print(f"{'study':18} {'costs read from':28} {'read path s':>12} {'whole report s':>15}")
    for study, what, read_s, full_s in rows:
        print(f"{study:18} {what:28} {read_s:12.2f} {'-' if full_s is None else f'{full_s:.2f}':>15}")
    (_, _, rn, fn), (_, _, ro, fo) = rows
    print(f"\nratio old / new: read path {ro / rn:.1f}x" + ("" if fn is None else f", whole report {fo / fn:.1f}x"))
    if fn is not None:
        print(f"target: whole report of {NEW} <= 15 s: {'met' if fn <= 15 else 'NOT met'} ({fn:.1f} s)")
    # the two paths give the same numbers: the summaries are what the metrics lines say
    cols = ["arch", "n_layer", "d_model", "peak_mem_bytes", "tokens_per_s_median"]
    tables = [pd.read_csv(out / f"{s}-read" / "depthbench_costs_measured.csv") for s in (NEW, OLD)]
    same = [t[cols].sort_values(cols).reset_index(drop=True) for t in tables]
    print(f"measured-costs tables of the two studies: {len(tables[0])} rows each, identical: {same[0].equals(same[1])}")


if __name__ == "__main__":
    main()
