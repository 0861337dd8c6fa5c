"""`ruff format --check` for the package: formatting depthbench_nb/*.py may change only what nbdev writes itself.

The package is nbdev's export of the formatted notebooks, so pyproject.toml keeps `ruff format` off it: nbdev joins
cells with one blank line where ruff puts two, and wraps the generated `__all__` its own way. This check formats each
module with ruff and fails unless the result equals the module once blank lines and the `__all__` statement are set
aside: any other difference is code that a notebook should have formatted."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUFF = Path(sys.executable).parent / "ruff"


def without_nbdev_layout(source: str) -> list[str]:
    "The module's lines without blank lines and without the `__all__` statement nbdev generates."
    skip = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]:
            skip |= set(range(node.lineno, node.end_lineno + 1))
    return [line for i, line in enumerate(source.splitlines(), 1) if line.strip() and i not in skip]


def formatted(path: Path) -> str:
    "The module as `ruff format` (the project's configuration) leaves it."
    args = [str(RUFF), "format", "--stdin-filename", str(path.relative_to(ROOT)), "-"]
    done = subprocess.run(args, cwd=ROOT, input=path.read_text(), capture_output=True, text=True, check=True)
    return done.stdout


def main() -> int:
    modules = sorted(p for p in (ROOT / "depthbench_nb").glob("*.py") if p.name != "_modidx.py")
    unformatted = [p.name for p in modules if without_nbdev_layout(p.read_text()) != without_nbdev_layout(formatted(p))]
    if unformatted:
        print(f"ruff format would change code in {len(unformatted)} module(s): {', '.join(unformatted)}")
        print("Format the notebooks that export them (ruff format nbs), then run nbdev_export.")
        return 1
    print(f"package: {len(modules)} modules as ruff format leaves them (apart from nbdev's blank lines and __all__)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
