#!/usr/bin/env bash
# One-command set-up of a checkout: a virtual environment in .venv, the pinned dependencies of
# requirements-dev.txt (torch together with everything that depends on it, so pip takes the CPU/CUDA
# torch the pin names and never a surprise build), the package in editable mode with its dev tools, and a
# Jupyter kernelspec "python3" inside the venv that runs the venv's own interpreter (in a venv, Jupyter
# prefers environment kernelspecs over user-level ones, so a stray ~/.local python3 kernel cannot win).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv .venv
fi
echo "[setup] installing pinned dependencies (requirements-dev.txt)"
.venv/bin/python -m pip install --disable-pip-version-check -q -r requirements-dev.txt
echo "[setup] installing the test-only OLMo-core parity dependency (requirements-interop.txt, without resolution: see its header)"
.venv/bin/python -m pip install --disable-pip-version-check -q --no-deps -r requirements-interop.txt
echo "[setup] installing depthbench-nb (editable)"
.venv/bin/python -m pip install --disable-pip-version-check -q --no-deps --no-build-isolation -e .
echo "[setup] registering the venv's interpreter as the Jupyter kernel 'python3'"
.venv/bin/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (depthbench-nb)" >/dev/null
echo "[setup] done: $(.venv/bin/depthbench-nb --version)"
