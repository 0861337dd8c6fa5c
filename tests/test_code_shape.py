"""Functions a reader can hold in their head: no function of the package is longer than 80 lines (from its `def` to
its last line, docstring included). Read from the source with `ast`, so the test names every long function at once."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "depthbench_nb"
MAX_LINES = 80


def long_functions(source: str) -> list[tuple[str, int]]:
    "(name, lines) of every function or method in `source` longer than MAX_LINES."
    functions = (n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return [(f.name, f.end_lineno - f.lineno + 1) for f in functions if f.end_lineno - f.lineno + 1 > MAX_LINES]


def test_the_length_rule_sees_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    assert long_functions(f"def f():\n{body}\n") == [("f", MAX_LINES + 1)]
    method_body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES - 1))
    assert long_functions(f"class C:\n    def m(self):\n{method_body}\n") == []  # exactly 80 lines: allowed


def test_no_library_function_is_longer_than_80_lines():
    found = {
        f"{path.name}:{name}": lines
        for path in sorted(PKG.glob("*.py"))
        if path.name != "_modidx.py"
        for name, lines in long_functions(path.read_text())
    }
    assert not found, f"split these into named helpers (at most {MAX_LINES} lines each): {found}"
