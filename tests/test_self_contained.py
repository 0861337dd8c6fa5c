"""The project is self-contained: no file a user gets cites notes that are not in this repository, or names the
work items the code was built in. Papers are cited by arXiv id and section/table/equation, the official code by
repository and file, and longer method notes live in docs/ (in the project's own words)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ["nbs", "depthbench_nb", "README.md", "docs", "benchmarks", "tests"]  # depthbench_nb/resources is inside
TEXT_SUFFIXES = {
    ".ipynb",
    ".py",
    ".md",
    ".yaml",
    ".yml",
    ".json",
    ".txt",
    ".cfg",
    ".toml",
    ".sh",
    ".csv",
    ".qmd",
    ".css",
    "",
}

# What a user does not have: the team's notes, and the names of work items. A note of the project's own under docs/
# (e.g. docs/looped.md) is not a team note, hence the look-behind on '/' and word characters. INTERFACES(.md) was the
# team's list of module interfaces; in capitals it names that note, never a word of the code.
FORBIDDEN = re.compile(
    r"specs/|(?<![\w/])(?:DESIGN|papers|architectures|looped|depthbench_official)\.md\b"
    r"|(?-i:\bINTERFACES\b)|\bissues? #?\d+|\bwork items?\b",
    re.IGNORECASE,
)


def scanned_files():
    me = Path(__file__).resolve()
    for entry in SCANNED:
        p = ROOT / entry
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
        for f in files:
            rel = f.relative_to(ROOT)
            if f.resolve() == me or any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
                continue
            if f.suffix in TEXT_SUFFIXES:
                yield f


def violations(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    return [
        f"{i}: {m.group(0)!r} in {line.strip()[:120]!r}"
        for i, line in enumerate(text.splitlines(), 1)
        for m in FORBIDDEN.finditer(line)
    ]


def test_the_pattern_finds_what_it_should():
    bad = [
        "see " + "specs" + "/looped.md §4",
        "DESIGN.md",
        "tools/INTERFACES.md",
        "(INTERFACES: collect)",
        "(papers.md)",  # split: this file must not cite a note itself
        "as in issue 15",
        "issue #16",
        "a work item",
    ]
    good = [
        "docs/looped.md",
        "docs/diagnostics.md",
        "arXiv 2609.32534 §3",
        "keyu-wang-2002/DepthBench src/model.py",
        "github.com/o/r/issues/12",
        "tissue 3",
        "the DepthModel interfaces",
    ]
    assert all(FORBIDDEN.search(s) for s in bad), [s for s in bad if not FORBIDDEN.search(s)]
    assert not any(FORBIDDEN.search(s) for s in good), [s for s in good if FORBIDDEN.search(s)]


def test_no_file_cites_notes_a_user_does_not_have():
    found = {f.relative_to(ROOT).as_posix(): violations(f) for f in scanned_files()}
    msg = [f"{rel}:{line}" for rel, vs in sorted(found.items()) for line in vs]
    assert not msg, f"{len(msg)} problem(s):\n" + "\n".join(msg)
