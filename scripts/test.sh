#!/usr/bin/env bash
# The test command (README, CI): notebooks and package agree, notebooks are clean, the notebooks' own
# tests (nbdev_test), the documentation site built (scripts/docs.sh) and the pytest suite, which reads the site in
# headless Chromium (tests/test_docs.py). Offline and single-threaded per worker by design.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=.venv/bin
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0 MPLBACKEND=Agg
export DEPTHBENCH_CACHE=${DEPTHBENCH_CACHE:-$PWD/.cache/depthbench-nb}

echo "== 1/5 nbdev_export leaves depthbench_nb/ unchanged"
$BIN/python scripts/check_sync.py export
echo "== 2/5 notebooks are clean (nbdev_clean changes nothing)"
$BIN/python scripts/check_sync.py clean
echo "== 3/5 nbdev_test (the tests inside the library notebooks)"
$BIN/nbdev_test --n_workers 2 --timing --skip_file_re '^[12][0-9]_' 2>&1 | tail -n 40
echo "== 4/5 the documentation site into _docs/ (every notebook run, the reports on the demo's records, links checked)"
bash scripts/docs.sh
echo "== 5/5 pytest (without the markers 'exhaustive' and 'paper_effort': see README, Testing)"
# `exhaustive`: the rest of the per-family sweeps (2-rank training, compile of every family): pytest -m exhaustive
# `paper_effort`: the fitter's longer checks against the scipy loop: pytest -m paper_effort
$BIN/python -m pytest -n 2 --durations=15 -q -m "not exhaustive and not paper_effort" "$@"
