#!/usr/bin/env bash
# Format and lint (the Contributing page, nbs/manual/contributing.qmd): `ruff format --check` and `ruff check` over the whole checkout, with the
# configuration in pyproject.toml (line length 120; the package depthbench_nb/*.py is nbdev's export of the formatted
# notebooks: scripts/check_package_format.py formats it apart from nbdev's own layout, and its lint findings are fixed
# in nbs/). All checks always run; exit 1 if any fails.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RUFF=.venv/bin/ruff
if [ ! -x "$RUFF" ]; then
    echo "lint: $RUFF not found: run scripts/setup.sh first (ruff is pinned in requirements-dev.txt)" >&2
    exit 2
fi
status=0

echo "== ruff format --check"
if ! "$RUFF" format --check .; then
    status=1
    echo "lint: files are not formatted. Fix with:" >&2
    echo "    $RUFF format nbs tests benchmarks scripts && .venv/bin/nbdev_export" >&2
    echo "  (nbdev_export brings the package in line with the reformatted notebooks)" >&2
fi

echo "== ruff format --check of the package (scripts/check_package_format.py)"
if ! .venv/bin/python scripts/check_package_format.py; then
    status=1
fi

echo "== ruff check"
if ! "$RUFF" check .; then
    status=1
    echo "lint: ruff check found problems (above). Fix them in the source: for depthbench_nb/*.py edit the" >&2
    echo "  notebook in nbs/ that exports it, then run:" >&2
    echo "    $RUFF format nbs tests benchmarks scripts && .venv/bin/nbdev_export" >&2
    echo "  ($RUFF check --fix nbs tests benchmarks scripts fixes the [*] findings, such as unused imports)" >&2
fi

if [ "$status" -eq 0 ]; then
    echo "lint: ruff format and ruff check are clean"
fi
exit "$status"
