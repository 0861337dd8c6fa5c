"""Do the notebooks read as chapters? Measures the library notebooks (`nbs/0*.ipynb`), the README and the public surface
against the project's limits, prints one line per figure and exits 1 naming whatever breaks a limit.

    .venv/bin/python scripts/notebook_shape.py            # the figures and the verdict
    .venv/bin/python scripts/notebook_shape.py --per-notebook
    .venv/bin/python scripts/notebook_shape.py --json

The limits (the fastcore notebooks, nbdev's model, have a median export cell of 7 lines and none over 56):

- an export cell (`#| export`, `#| exporti`, `#| exports`) has at most 120 lines; their median is at most 25;
- every notebook has at least one example cell (a code cell that is not exported, not hidden set-up and not empty)
  per 40 exported lines;
- exported code is at most 75% of the library notebooks' code lines;
- README.md has at most 250 lines; its prose sentences have a median of at most 20 words and none over 50;
- the package's `__all__` lists at most 500 names;
- each chapter's page opens with its introduction (set-up cells hidden) and its description is a complete sentence.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMITS = dict(
    median_export_cell=25,
    max_export_cell=120,
    exported_lines_per_example=40,
    exported_share=0.75,
    readme_lines=250,
    readme_median_words=20,
    readme_max_words=50,
    public_names=500,
)
EXPORT = re.compile(r"^\s*#\|\s*export(i|s)?\b", re.M)  # exports: exported, and its code shown on the page
HIDE = re.compile(r"^\s*#\|\s*hide\b", re.M)


def _code_lines(source: str) -> list[str]:
    "The lines of a cell that are code: not blank, not a directive (`#| ...`)."
    return [ln for ln in source.splitlines() if ln.strip() and not ln.lstrip().startswith("#|")]


def _cell_kind(cell: dict) -> str:
    "export, setup (hidden), example or empty for a code cell; markdown otherwise."
    if cell["cell_type"] != "code":
        return "markdown"
    src = "".join(cell["source"])
    if not _code_lines(src):
        return "empty"
    if EXPORT.search(src):
        return "export"
    if HIDE.search(src) or re.search(r"^\s*#\|\s*default_exp\b", src, re.M):
        return "setup"
    return "example"


def _opening(cells: list[dict]) -> tuple[str, str]:
    """The page's description (the title cell's `> ` lines) and the kind of the first cell a reader sees after the
    title: hidden set-up and the `default_exp` cell are not shown."""
    title = "".join(cells[0]["source"]) if cells and cells[0]["cell_type"] == "markdown" else ""
    # nbdev takes the first `> ` line as the page's description: a sentence wrapped over two lines is cut
    description = next((ln[1:].strip() for ln in title.splitlines() if ln.startswith(">")), "")
    first = next((_cell_kind(c) for c in cells[1:] if _cell_kind(c) not in ("setup", "empty") and _shown(c)), "none")
    return description, first


def _title_prose(cells: list[dict]) -> str:
    "Text of the title cell besides its title, description and nbdev's `- key: value` lines (nbdev drops it)."
    if not cells or cells[0]["cell_type"] != "markdown":
        return ""
    lines = "".join(cells[0]["source"]).splitlines()
    other = [ln for ln in lines if ln.strip() and not re.match(r"^(# |>|- [\w_]+: )", ln)]
    return " ".join(other)[:80]


def _shown(cell: dict) -> bool:
    "Whether a cell shows on its page: an export cell of imports only shows nothing (nbdev hides export sources)."
    if _cell_kind(cell) != "export":
        return True
    try:
        tree = ast.parse("\n".join(_code_lines("".join(cell["source"]))))
    except SyntaxError:
        return True
    return not all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body)


def notebook_shape(path: Path) -> dict:
    "Export cells' sizes, exported and example code lines, and the count of example cells of one notebook."
    cells = json.loads(path.read_text())["cells"]
    description, first = _opening(cells)
    sizes, exported, other, examples = [], 0, 0, 0
    for cell in cells:
        kind = _cell_kind(cell)
        lines = len(_code_lines("".join(cell["source"]))) if cell["cell_type"] == "code" else 0
        if kind == "export":
            sizes.append(lines)
            exported += lines
        else:
            other += lines
            examples += kind == "example"
    return dict(
        notebook=path.name,
        export_cells=sizes,
        exported_lines=exported,
        other_lines=other,
        examples=examples,
        description=description,
        opens_with=first,
    )


def _sentences(markdown: str) -> list[str]:
    "The prose sentences of a markdown text: code blocks, tables, headings, images and link targets left out."
    text = re.sub(r"```.*?```", " ", markdown, flags=re.S)
    keep = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith(("#", "|", "![", "<", "    ")) or line.startswith("    "):
            keep.append("\n")
            continue
        keep.append(re.sub(r"^([-*]|\d+\.)\s+", "\n", s))
    prose = " ".join(keep)
    prose = re.sub(r"\]\([^)]*\)", "]", prose)  # a link counts as its text
    prose = re.sub(r"`[^`]*`", "CODE", prose)  # inline code is one word
    parts = re.split(r"(?<=[.!?:;])\s+(?=[A-Z(`*\"])|\n", prose)
    return [p.strip() for p in parts if len(p.split()) >= 3]


def readme_shape(path: Path) -> dict:
    "README.md's line count and the word counts of its sentences."
    text = path.read_text()
    words = [len(s.split()) for s in _sentences(text)]
    long = [s for s in _sentences(text) if len(s.split()) > LIMITS["readme_max_words"]]
    return dict(lines=len(text.splitlines()), sentence_words=words, long_sentences=long)


def public_names(pkg: Path) -> dict[str, list[str]]:
    "Each module's `__all__`, read with `ast` (nothing is imported)."
    found = {}
    for path in sorted(pkg.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
                found[path.stem] = [ast.literal_eval(e) for e in node.value.elts]
    return found


def measure(root: Path = ROOT) -> dict:
    "Every figure the limits speak of, and the list of breaches (empty when the notebooks read as chapters)."
    nbs = [notebook_shape(p) for p in sorted((root / "nbs").glob("0*.ipynb"))]
    sizes = [s for nb in nbs for s in nb["export_cells"]]
    exported = sum(nb["exported_lines"] for nb in nbs)
    total = exported + sum(nb["other_lines"] for nb in nbs)
    readme = readme_shape(root / "README.md")
    names = public_names(root / "depthbench_nb")
    per = LIMITS["exported_lines_per_example"]
    thin = {
        nb["notebook"]: (nb["examples"], nb["exported_lines"])
        for nb in nbs
        if nb["examples"] * per < nb["exported_lines"]
    }
    figures = dict(
        notebooks=len(nbs),
        export_cells=len(sizes),
        median_export_cell=statistics.median(sizes) if sizes else 0,
        max_export_cell=max(sizes, default=0),
        export_cells_over_max=sum(s > LIMITS["max_export_cell"] for s in sizes),
        exported_lines_per_example=round(exported / max(1, sum(nb["examples"] for nb in nbs)), 1),
        exported_share=round(exported / max(1, total), 3),
        readme_lines=readme["lines"],
        readme_median_words=statistics.median(readme["sentence_words"]) if readme["sentence_words"] else 0,
        readme_max_words=max(readme["sentence_words"], default=0),
        public_names=sum(len(v) for v in names.values()),
    )
    breaches = []
    if figures["median_export_cell"] > LIMITS["median_export_cell"]:
        breaches.append(f"median export cell {figures['median_export_cell']} lines > {LIMITS['median_export_cell']}")
    for nb in nbs:
        big = [s for s in nb["export_cells"] if s > LIMITS["max_export_cell"]]
        if big:
            breaches.append(f"{nb['notebook']}: export cells of {big} lines > {LIMITS['max_export_cell']}")
    for name, (n, lines) in thin.items():
        breaches.append(f"{name}: {n} example cells for {lines} exported lines (need {-(-lines // per)})")
    for path in sorted((root / "nbs").glob("*.ipynb")):  # every page, the templates and reports included
        cells = json.loads(path.read_text())["cells"]
        d, _ = _opening(cells)
        if _title_prose(cells):  # nbdev turns the title cell into the page's header and drops the rest of it
            breaches.append(f"{path.name}: the title cell holds prose the page would not show: {_title_prose(cells)!r}")
        if not re.match(r"^[A-Z`].*[.!?]$", d) or len(d.split()) < 4:
            breaches.append(f"{path.name}: the page's description is not one complete sentence on one line: {d!r}")
    for nb in nbs:
        if nb["opens_with"] != "markdown":
            breaches.append(f"{nb['notebook']}: the page opens with a {nb['opens_with']} cell, not its introduction")
    if figures["exported_share"] > LIMITS["exported_share"]:
        breaches.append(f"exported code is {figures['exported_share']:.0%} of the code lines > 75%")
    for key in ("readme_lines", "readme_median_words", "readme_max_words", "public_names"):
        if figures[key] > LIMITS[key]:
            breaches.append(f"{key} {figures[key]} > {LIMITS[key]}")
    breaches += [
        f"README sentence over {LIMITS['readme_max_words']} words: {s[:80]}..." for s in readme["long_sentences"]
    ]
    return dict(figures=figures, limits=LIMITS, breaches=breaches, notebooks=nbs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures, limits and breaches as JSON")
    parser.add_argument("--per-notebook", action="store_true", help="one line per library notebook as well")
    args = parser.parse_args(argv)
    result = measure()
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "notebooks" or args.per_notebook}, indent=1))
    else:
        for key, value in result["figures"].items():
            limit = LIMITS.get(key)
            print(f"{key:28} {value}" + (f"  (limit {limit})" if limit is not None else ""))
        if args.per_notebook:
            for nb in result["notebooks"]:
                s = nb["export_cells"]
                print(
                    f"{nb['notebook']:28} cells {len(s):3} median {statistics.median(s) if s else 0:5} "
                    f"max {max(s, default=0):4} exported {nb['exported_lines']:5} examples {nb['examples']:3}"
                )
        print("\n".join(f"BREACH {b}" for b in result["breaches"]) or "notebook shape: every limit met")
    return 1 if result["breaches"] else 0


if __name__ == "__main__":
    sys.exit(main())
