"""Run benchmark scripts and record their JSON output, with the command, the machine and the date, in
benchmarks/results/NAME.json: the Performance page of the documentation site (nbs/performance.ipynb) is built from
those files, and nothing else.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/record.py            # every CPU benchmark
    .venv/bin/python benchmarks/record.py models permutation                           # some of them
    .venv/bin/python benchmarks/record.py --list

Each benchmark runs in a process of its own, one after the other (never side by side: they would time each other).
A benchmark measures its baseline in the same run, so its ratios are the figures to compare across machines; the
seconds depend on the machine and on its load, which the record keeps (the load average before and after).
`gpu_check.py` writes its own JSON on a GPU machine: record it with `--import gpu_check=PATH`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
# name -> (script, arguments, the option naming the JSON file it writes (None: it prints the JSON), what it measures)
BENCHMARKS = {
    "models": (
        "bench_models.py",
        [],
        "--json",
        "Forward+backward step time and activation memory of every design relative to Pre-LN (tiny shape, CPU).",
    ),
    "train": (
        "bench_train.py",
        ["--L", "8,32", "--archs", "preln,hc,mhc,attnres,block_attnres,moda", "--steps", "4"]
        + ["--mixing", "fused,reference"],
        "--json",
        "Training throughput of six designs relative to Pre-LN at L = 8 and 32 (tiny, CPU), with the depth mixing "
        "computed by the fused path and by the reference ops side by side.",
    ),
    "data": (
        "bench_data.py",
        ["--files", "4", "--repeats", "2", "--skip-memory", "--hash-mb", "256"],
        None,
        "Data preparation: tokens/s of 1 and 2 workers against raw `tokenizers` in one run, and the checksum rate.",
    ),
    "decode": (
        "bench_decode.py",
        [],
        "--out",
        "Greedy decoding with the KV cache: prefill and decode tokens/s and KV-cache bytes of every design.",
    ),
    "permutation": (
        "bench_permutation.py",
        [],
        "--json",
        "The permutation score of 32 layers: the shared-prefix batched evaluation against the plain swap loop.",
    ),
    "hf_diagnose": (
        "bench_hf_diagnose.py",
        [],
        "--json",
        "Diagnostics of a Transformers LLaMA (16 layers): batched perturbed forwards against one forward each.",
    ),
    "fit": (
        "bench_fit.py",
        [],
        "--json",
        "The looped law's fitter at the paper's effort (500 starts, bootstrap): batched against the scipy loop.",
    ),
}


def machine() -> dict:
    "What the figures depend on: the CPU, its cores, memory, Python, torch, the GPU if any."
    cpu = (
        next(
            (
                ln.split(":", 1)[1].strip()
                for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if "model name" in ln
            ),
            platform.processor() or "unknown",
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if hasattr(os, "sysconf") else None
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return dict(
        cpu=cpu,
        logical_cpus=os.cpu_count(),
        memory_gib=round(mem, 1) if mem else None,
        gpu=gpu,
        python=platform.python_version(),
        torch=torch.__version__,
        platform=platform.platform(),
    )


def _write(path: Path, record: dict) -> None:
    "Atomic: a reader never sees half a record."
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=float) + "\n")
    os.replace(tmp, path)


def record(name: str, info: dict) -> dict:
    "Run one benchmark, read the JSON it writes, and keep it with its command, the machine and the date."
    script, args, json_opt, what = BENCHMARKS[name]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, str(HERE / script), *args] + ([json_opt, str(out)] if json_opt else [])
        load_before, start = os.getloadavg(), time.time()
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode != 0 or not (out.exists() or json_opt is None):
            raise SystemExit(
                f"{name}: {script} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            )
        result = json.loads(out.read_text() if json_opt else done.stdout)
    shown = "OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python " + shlex.join([f"benchmarks/{script}", *args])
    rec = dict(
        benchmark=name,
        what=what,
        command=shown,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        machine=info,
        load_average_before=round(load_before[0], 2),
        load_average_after=round(os.getloadavg()[0], 2),
        wall_s=round(time.time() - start, 1),
        result=result,
        stdout_tail=done.stdout[-1500:],
    )
    _write(RESULTS / f"{name}.json", rec)
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"benchmarks to run (default: all of {', '.join(BENCHMARKS)})")
    ap.add_argument("--list", action="store_true", help="list the benchmarks and what each measures")
    ap.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="record a JSON a benchmark wrote elsewhere (e.g. gpu_check=gpu_check.json)",
    )
    a = ap.parse_args(argv)
    if a.list:
        for name, (script, args, _, what) in BENCHMARKS.items():
            print(f"{name:12} {script} {' '.join(args)}\n{'':12} {what}")
        return 0
    unknown = [n for n in a.names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark {unknown}; the benchmarks are: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    info = machine()
    for item in a.imports:
        name, _, path = item.partition("=")
        rec = dict(
            benchmark=name,
            what=f"{name} (imported)",
            command=f"benchmarks/{name}.py",
            machine=info,
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            result=json.loads(Path(path).read_text()),
        )
        _write(RESULTS / f"{name}.json", rec)
    for name in a.names or ([] if a.imports else list(BENCHMARKS)):
        rec = record(name, info)
        print(
            f"[record] {name}: {rec['wall_s']} s (load {rec['load_average_before']} -> "
            f"{rec['load_average_after']}) -> {RESULTS.relative_to(HERE.parent) / (name + '.json')}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
