"""Packing throughput and memory of depthbench_nb.data.

1. Throughput: tokenize + pack (EOS, dtype cast, shard writes, sha256, document index) of the sample corpus's
   training documents, as a ratio to raw `tokenizers` `encode_batch` on the same text, with the same batches,
   in the same run (best of --repeats). Aim: ratio >= 0.7.
2. Memory: peak RSS of a child process that packs the sample corpus 1x and 10x (streamed, every document
   made unique), so flat memory shows as a 10x/1x ratio close to 1.

    OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 python benchmarks/bench_data.py
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')

from depthbench_nb import data as D  # noqa: E402

CHILD = r'''
import os, resource, sys, tempfile, time
from pathlib import Path
from depthbench_nb import data as D
copies, tokenizer = int(sys.argv[1]), sys.argv[2]
src = D.resolve_source('sample')
tok = D.load_tokenizer(tokenizer, src)
base = list(src.documents('train'))
def docs():  # streamed: each copy is rebuilt on the fly, so the corpus is never held whole
    for c in range(copies):
        for d in base: yield f"{d}\n({c})"
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with tempfile.TemporaryDirectory() as tmp:
    t0 = time.perf_counter()
    res = D.pack_split(docs(), tok, Path(tmp), 'train', D.token_dtype(tok.vocab_size), progress=False)
    dt = time.perf_counter() - t0
print(res['tokens'], dt, rss0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
'''


def throughput(tokenizer: str, repeats: int) -> dict:
    src = D.resolve_source('sample')
    tok = D.load_tokenizer(tokenizer, src)
    docs = list(src.documents('train'))
    batches = list(D._batches(docs))
    n_chars = sum(map(len, docs))
    raw, packed, n_tok = [], [], 0
    def run_raw():
        t0 = time.perf_counter()
        for b in batches: tok.tokenizer.encode_batch(b, add_special_tokens=False)
        raw.append(time.perf_counter() - t0)
    def run_pack():
        nonlocal n_tok
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            res = D.pack_split(iter(docs), tok, Path(tmp), 'train', D.token_dtype(tok.vocab_size), progress=False)
            packed.append(time.perf_counter() - t0)
            n_tok = res['tokens']
    for i in range(repeats):  # alternate the order so that neither side always runs warm
        for f in ((run_raw, run_pack) if i % 2 == 0 else (run_pack, run_raw)): f()
    t_raw, t_pack = min(raw), min(packed)
    return dict(tokenizer=tokenizer, documents=len(docs), chars=n_chars, tokens=n_tok,
                raw_encode_batch_s=round(t_raw, 3), pack_s=round(t_pack, 3),
                raw_tok_per_s=round(n_tok / t_raw), pack_tok_per_s=round(n_tok / t_pack), ratio=round(t_raw / t_pack, 3))


def memory(tokenizer: str) -> dict:
    out = {}
    for copies in (1, 10):
        r = subprocess.run([sys.executable, '-c', CHILD, str(copies), tokenizer], capture_output=True, text=True, check=True)
        tokens, dt, rss0, rss1 = r.stdout.split()
        out[f'{copies}x'] = dict(tokens=int(tokens), seconds=round(float(dt), 2), peak_rss_mb=round(int(rss1) / 1024, 1),
                                 rss_before_pack_mb=round(int(rss0) / 1024, 1))
    out['peak_ratio_10x_over_1x'] = round(out['10x']['peak_rss_mb'] / out['1x']['peak_rss_mb'], 3)
    return out


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--tokenizer', default='bpe:4096', help='bpe:4096 (default) or neox')
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--skip-memory', action='store_true')
    a = p.parse_args()
    res = dict(throughput=throughput(a.tokenizer, a.repeats))
    if not a.skip_memory: res['memory'] = memory(a.tokenizer)
    print(json.dumps(res, indent=2))
