#!/usr/bin/env bash
# The documentation site into _docs/ (index.html, a page per notebook, search.json): nbdev processes every notebook of
# nbs/ and runs its cells (not the slow/gpu ones), the reports run on the CPU demo's records in docs/example_study/, and
# scripts/docs.py renders the pages and checks every internal link. Look at it: python -m http.server -d _docs 8000
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0 MPLBACKEND=Agg TQDM_DISABLE=1
export DEPTHBENCH_CACHE=${DEPTHBENCH_CACHE:-$PWD/.cache/depthbench-nb}
start=$(date +%s)
.venv/bin/python scripts/docs.py "$@"
echo "[docs] done in $(( $(date +%s) - start )) s"
