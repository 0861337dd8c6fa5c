"""Data preparation throughput and memory of depthbench_nb.data, against raw `tokenizers` in the same run.

A multi-file corpus (the offline sample's chapters, `--files` jsonl files of `--copies` copies each, every document
made unique) is prepared with `prepare_folder` by 1 and 2 worker processes, and the same documents are encoded by raw
`tokenizers` (`encode_batch`, and `encode_batch_fast`, which skips character offsets) in the same batches, one thread,
in the same run. Each measurement is a fresh process; orders alternate; best of --repeats.

1. Throughput: tokens/s of each, and the ratios the targets are about: 2 workers / 1 worker (target >= 1.7 on a
   2-core machine) and 1 worker / raw encode_batch (target >= 0.9). The 1-worker figure is the whole `prepare`
   (read the files, tokenize, EOS, cast, write, sha256, document indexes, pack, manifest). The same per CPU second
   (this process and its workers): on a machine other work loads, wall clocks measure that load, CPU time the work;
   `speedup_of_2_workers_on_2_free_cores` = 2 x CPU time of one worker / CPU time of two.
   The machine's own ceiling, in the same run: two raw `encode_batch` processes side by side, each on half of the
   files (`raw_encode_batch_2_processes`). Two processes on two virtual CPUs rarely get 2x (the CPUs may share a
   physical core, cache and memory bandwidth, or be busy with other work): `ratio_raw_2_processes_over_1` is what the
   machine gives any two-process program, and `ratio_2_workers_over_raw_2_processes` how close `prepare` comes to it.
   What load does not change: the serial part of one worker's `prepare` (all but the tokenizing of source shards, which
   the workers share: the plan, the tokenizer, packing, the manifest), `serial_fraction_1_worker` (median of the runs),
   and the speedup Amdahl's law bounds two workers to on two free cores with it, `amdahl_bound_2_workers` (the files
   are of equal size, so the shards split evenly).
3. Checksums (`--hash-only` for this part alone): what the loader's check costs. `TokenData` hashes each token file
   (sha256, `depthbench_nb.data.sha256_file`) on its first use, and a resumed `prepare` hashes each source shard it
   keeps: the rate in GB/s of one process over a `--hash-mb` file of tokens (best of --repeats; the file is in the page
   cache, so this is the CPU's rate, the floor; a cold disk or a shared filesystem slower than it sets the time
   instead), and the seconds that makes at paper scale: 8B and 32B tokens at 2 bytes a token (16 and 64 GB; uint16,
   the NeoX vocabulary) per process that reads the whole stream once.
2. Memory per worker: peak resident set (RSS, which counts pages shared with the parent after fork) and peak
   private memory (USS: Private_Clean + Private_Dirty of /proc/PID/smaps_rollup, what each added worker costs),
   sampled every 50 ms, for the corpus at 1x and 4x its size: flat memory shows as a 4x/1x ratio close to 1.

    OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 python benchmarks/bench_data.py
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

CHILD = r"""
import json, os, resource, sys, time
from pathlib import Path
from depthbench_nb import data as D
from depthbench_nb.config import DataConfig
mode, corpus, tokenizer, out = sys.argv[1:5]
part, parts = map(int, (sys.argv[5] if len(sys.argv) > 5 else '0/1').split('/'))
if mode == 'raw':                      # the same documents, in the batches prepare uses, encoded by tokenizers alone
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer)
    src = D.resolve_source(corpus)
    batches = []
    for shard in src.shards()[part::parts]:     # one of `parts` processes side by side: its share of the files
        docs = list(src.shard_documents(shard))
        batches += [docs[i:i + D.BATCH_DOCS] for i in range(0, len(docs), D.BATCH_DOCS)]
    res = {}
    cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    for name in ('encode_batch', 'encode_batch_fast') if parts == 1 else ('encode_batch',):
        encode = getattr(tok, name)
        t0, c0, n, start = time.perf_counter(), cpu(), 0, time.time()
        for b in batches: n += sum(len(e.ids) for e in encode(b, add_special_tokens=False))
        res[name] = dict(seconds=time.perf_counter() - t0, cpu_seconds=cpu() - c0, tokens=n, start=start,
                         end=time.time())
    print(json.dumps(res))
else:
    workers = int(mode)
    usage = lambda who: sum(resource.getrusage(who)[:2])
    cpu = lambda: usage(resource.RUSAGE_SELF) + usage(resource.RUSAGE_CHILDREN)
    t0, c0 = time.perf_counter(), cpu()
    r = D.prepare_folder(DataConfig(source=corpus, tokenizer=tokenizer, path=out), progress=False, workers=workers)
    dt, dc = time.perf_counter() - t0, cpu() - c0   # CPU: this process and its workers (reaped when the pool closed)
    man = json.loads((Path(out) / 'manifest.json').read_text())
    tokens = man['splits']['train']['tokens'] + man['splits']['val']['tokens']
    shard_seconds = sum(json.loads(p.read_text())['seconds'] for p in Path(out).glob('shards/*/shard.json'))
    print(json.dumps(dict(seconds=dt, cpu_seconds=dc, tokens=tokens, shards=r.source_shards,
                          shard_seconds=shard_seconds)))
"""


def make_corpus(folder: Path, files: int, copies: int) -> Path:
    "`files` jsonl files, each the sample's chapters `copies` times, every document unique (a copy marker)."
    from depthbench_nb import data as D

    chapters = list(D._kjv_chapters())
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        with open(folder / f"part_{f:03d}.jsonl", "w") as fh:
            for c in range(copies):
                for d in chapters:
                    fh.write(json.dumps(dict(text=f"{d}\n({f}.{c})")) + "\n")
    return folder


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _memory_mb(pid: int) -> tuple[float, float]:
    "(RSS, USS) of a process in MB, from /proc/PID/smaps_rollup."
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0.0, 0.0
    kb = {line.split(":")[0]: int(line.split()[1]) for line in text.splitlines()[1:] if line.split()[1].isdigit()}
    return kb.get("Rss", 0) / 1024, (kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)) / 1024


def run_pair(corpus: Path, tokenizer: str, tmp: Path) -> dict:
    "Two raw encode_batch processes side by side, each on half of the files: from the first start to the last end."
    ps = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, "raw", str(corpus), tokenizer, str(tmp / "unused"), f"{i}/2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    res = []
    for p in ps:
        out, err = p.communicate()
        if p.returncode:
            raise RuntimeError(f"raw pair child failed: {err[-2000:]}")
        res.append(json.loads(out.strip().splitlines()[-1])["encode_batch"])
    return dict(
        seconds=max(r["end"] for r in res) - min(r["start"] for r in res),
        cpu_seconds=sum(r["cpu_seconds"] for r in res),
        tokens=sum(r["tokens"] for r in res),
    )


def run_child(args: list[str], watch: bool = False) -> tuple[dict, dict]:
    "Run CHILD with `args`; with `watch`, the peak RSS and USS of the coordinator and of each worker process."
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    peaks: dict = {}

    def sample():
        while p.poll() is None:
            for pid in [p.pid] + _children(p.pid):
                rss, uss = _memory_mb(pid)
                old = peaks.get(pid, (0.0, 0.0))
                peaks[pid] = (max(old[0], rss), max(old[1], uss))
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    if watch:
        t.start()
    out, err = p.communicate()
    if p.returncode:
        raise RuntimeError(f"child {args[0]} failed: {err[-2000:]}")
    if watch:
        t.join()
    coord = peaks.pop(p.pid, (0.0, 0.0))
    mem = dict(
        coordinator_rss_mb=round(coord[0], 1),
        coordinator_uss_mb=round(coord[1], 1),
        worker_rss_mb=[round(v[0], 1) for v in peaks.values()],
        worker_uss_mb=[round(v[1], 1) for v in peaks.values()],
    )
    return json.loads(out.strip().splitlines()[-1]), mem


def throughput(corpus: Path, tokenizer: str, tmp: Path, repeats: int) -> dict:
    best: dict = {}
    serial: list[float] = []

    def keep(name, r):
        for key in ("seconds", "cpu_seconds"):
            old = best.setdefault(name, dict(tokens=r["tokens"]))
            old[key] = min(old.get(key, float("inf")), r[key])

    for i in range(repeats):
        order = ("raw", "1", "2", "raw2") if i % 2 == 0 else ("raw2", "2", "1", "raw")  # alternate: none always warm
        for mode in order:
            if mode == "raw2":
                keep("raw_encode_batch_2_processes", run_pair(corpus, tokenizer, tmp))
                continue
            out = tmp / f"out-{mode}"
            shutil.rmtree(out, ignore_errors=True)
            res, _ = run_child([mode, str(corpus), tokenizer, str(out)])
            if mode == "raw":
                for name, r in res.items():
                    keep(f"raw_{name}", r)
            else:
                keep("prepare_1_worker" if mode == "1" else f"prepare_{mode}_workers", res)
            if mode == "1":
                serial.append(1 - res["shard_seconds"] / res["seconds"])
            shutil.rmtree(out, ignore_errors=True)
    wall = {k: round(v["tokens"] / v["seconds"]) for k, v in best.items()}
    cpu = {k: round(v["tokens"] / v["cpu_seconds"]) for k, v in best.items()}
    one, two = best["prepare_1_worker"], best["prepare_2_workers"]
    f = sorted(serial)[len(serial) // 2]
    return dict(
        tokens_per_s=wall,
        tokens_per_cpu_s=cpu,
        best=best,
        ratio_2_workers_over_1=round(wall["prepare_2_workers"] / wall["prepare_1_worker"], 3),
        # the machine's ceiling for any two processes, and how close prepare's two workers come to it
        ratio_raw_2_processes_over_1=round(wall["raw_encode_batch_2_processes"] / wall["raw_encode_batch"], 3),
        ratio_2_workers_over_raw_2_processes=round(wall["prepare_2_workers"] / wall["raw_encode_batch_2_processes"], 3),
        ratio_1_worker_over_raw_encode_batch=round(wall["prepare_1_worker"] / wall["raw_encode_batch"], 3),
        ratio_1_worker_over_raw_encode_batch_fast=round(wall["prepare_1_worker"] / wall["raw_encode_batch_fast"], 3),
        # on a loaded machine wall clocks measure the load: CPU time measures the work. Two workers on two free
        # cores give 2 x (CPU of one worker / CPU of two) of one worker's rate
        cpu_ratio_1_worker_over_raw_encode_batch=round(cpu["prepare_1_worker"] / cpu["raw_encode_batch"], 3),
        cpu_ratio_1_worker_over_raw_encode_batch_fast=round(cpu["prepare_1_worker"] / cpu["raw_encode_batch_fast"], 3),
        speedup_of_2_workers_on_2_free_cores=round(2 * one["cpu_seconds"] / two["cpu_seconds"], 3),
        serial_fraction_1_worker=round(f, 4),
        amdahl_bound_2_workers=round(1 / (f + (1 - f) / 2), 3),
    )


def memory(tmp: Path, tokenizer: str, files: int, copies: int) -> dict:
    out = {}
    for scale in (1, 4):
        corpus = make_corpus(tmp / f"mem-{scale}x", files, copies * scale)
        res, mem = run_child(["2", str(corpus), tokenizer, str(tmp / f"mem-out-{scale}x")], watch=True)
        out[f"{scale}x"] = dict(tokens=res["tokens"], **mem)
        shutil.rmtree(corpus, ignore_errors=True)
        shutil.rmtree(tmp / f"mem-out-{scale}x", ignore_errors=True)

    def peak(s, k):
        return max(out[s][k]) if out[s][k] else 0.0

    out["worker_uss_ratio_4x_over_1x"] = round(peak("4x", "worker_uss_mb") / max(peak("1x", "worker_uss_mb"), 1e-9), 3)
    out["worker_rss_ratio_4x_over_1x"] = round(peak("4x", "worker_rss_mb") / max(peak("1x", "worker_rss_mb"), 1e-9), 3)

    def coordinator(s):
        return out[s]["coordinator_rss_mb"]

    out["coordinator_rss_ratio_4x_over_1x"] = round(coordinator("4x") / max(coordinator("1x"), 1e-9), 3)
    return out


def hashing(tmp: Path, mb: int, repeats: int) -> dict:
    "sha256 rate of one process over a file of `mb` MB of tokens, and what it makes at paper scale (8B, 32B tokens)."
    import numpy as np

    from depthbench_nb.data import sha256_file

    path = tmp / "tokens.bin"
    np.random.default_rng(0).integers(0, 50_000, size=mb * (1 << 19), dtype=np.uint16).tofile(path)
    sha256_file(path)  # into the page cache
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        sha256_file(path)
        best = min(best, time.perf_counter() - t0)
    rate = mb * (1 << 20) / best
    scale = {f"{n}B_tokens": dict(gb=n * 2, seconds=round(n * 2e9 / rate, 1)) for n in (8, 32)}
    return dict(file_mb=mb, seconds=round(best, 3), gb_per_s=round(rate / 1e9, 3), paper_scale=scale)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokenizer", default="bpe:4096", help="bpe:4096 (default, trained once on the sample) or neox")
    p.add_argument("--files", type=int, default=8, help="files in the corpus: the units of work (default 8)")
    p.add_argument(
        "--copies", type=int, default=1, help="copies of the sample per file (default 1: about 1M tokens a file)"
    )
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--hash-only", action="store_true", help="only the checksum rate (part 3)")
    p.add_argument("--hash-mb", type=int, default=1024, help="MB of tokens hashed (default 1024)")
    a = p.parse_args()
    if a.hash_only:
        with tempfile.TemporaryDirectory() as d:
            print(
                json.dumps(
                    dict(machine=dict(cpus=os.cpu_count()), checksums=hashing(Path(d), a.hash_mb, a.repeats)), indent=2
                )
            )
        sys.exit(0)
    from depthbench_nb import data as D

    tok = D.load_tokenizer(a.tokenizer, D.resolve_source("sample"))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        tokenizer = str(tmp / "tokenizer.json")
        tok.tokenizer.save(tokenizer)
        corpus = make_corpus(tmp / "corpus", a.files, a.copies)
        res = dict(
            machine=dict(cpus=os.cpu_count(), load_before=os.getloadavg()),
            corpus=dict(files=a.files, copies=a.copies),
            throughput=throughput(corpus, tokenizer, tmp, a.repeats),
        )
        if not a.skip_memory:
            res["memory"] = memory(tmp, tokenizer, a.files, a.copies)
        res["checksums"] = hashing(tmp, a.hash_mb, a.repeats)
        res["machine"]["load_after"] = os.getloadavg()
    print(json.dumps(res, indent=2))
