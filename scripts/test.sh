#!/usr/bin/env bash
# The test command (README, CI): formatted and lint-clean (ruff, scripts/lint.sh), notebooks and package agree,
# notebooks are clean, the notebooks read as chapters (scripts/notebook_shape.py), the documentation site built
# (scripts/docs.sh: every notebook runs there once, its examples and tests included, so the build is the notebooks'
# test) and the pytest suite, which reads the site in headless Chromium (tests/test_docs.py). Offline and
# single-threaded per worker by design.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=.venv/bin
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0 MPLBACKEND=Agg
# Hermetic: this run's own runs folder and data cache, whatever a demo, a sweep or an earlier test run left in the
# checkout (papermill_runs/) or in a cache; removed at the end. (pytest's conftest.py makes its own inside as well.)
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/depthbench-test.XXXXXX")
trap 'rm -rf "$SCRATCH"' EXIT
export DEPTHBENCH_RUNS=$SCRATCH/runs DEPTHBENCH_CACHE=$SCRATCH/cache
unset DEPTHBENCH_TEST_SCRATCH

echo "== 1/6 ruff format --check and ruff check (scripts/lint.sh)"
bash scripts/lint.sh
echo "== 2/6 nbdev_export leaves depthbench_nb/ unchanged"
$BIN/python scripts/check_sync.py export
echo "== 3/6 notebooks are clean (nbdev_clean changes nothing)"
$BIN/python scripts/check_sync.py clean
echo "== 4/6 the notebooks read as chapters (cell sizes, examples, README, public names: scripts/notebook_shape.py)"
$BIN/python scripts/notebook_shape.py
echo "== 5/6 the documentation site into _docs/: every notebook runs once, its examples and tests included (the"
echo "       notebooks' test, as nbdev_test runs them), the reports on the demo's records, links checked"
bash scripts/docs.sh
echo "== 6/6 pytest (without the markers 'exhaustive' and 'paper_effort': see the Testing page, nbs/manual/testing.qmd)"
# `exhaustive`: the rest of the per-family sweeps (2-rank training, compile of every family): pytest -m exhaustive
# `paper_effort`: the fitter's longer checks against the scipy loop: pytest -m paper_effort
$BIN/python -m pytest -n 2 --durations=15 -q -m "not exhaustive and not paper_effort" "$@"
