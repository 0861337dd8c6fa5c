"""The chapter-shape check (scripts/notebook_shape.py, run by the test command) sees what it should: a long export cell,
a notebook with too few examples, a long README sentence, and the limits hold on the project itself."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("notebook_shape", ROOT / "scripts" / "notebook_shape.py")
shape = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shape)


def _nb(path: Path, cells: list[tuple[str, str]]) -> Path:
    "A minimal notebook of (cell_type, source) cells."
    nb = dict(
        cells=[dict(cell_type=t, source=s, metadata={}, **({"outputs": []} if t == "code" else {})) for t, s in cells],
        metadata={},
        nbformat=4,
        nbformat_minor=5,
    )
    path.write_text(json.dumps(nb))
    return path


def _project(tmp_path: Path, export_lines: int, examples: int, readme: str, example_lines: int = 1) -> Path:
    "A made-up project: one library notebook, a README, an empty package."
    (tmp_path / "nbs").mkdir()
    (tmp_path / "depthbench_nb").mkdir()
    (tmp_path / "depthbench_nb" / "m.py").write_text("__all__ = ['a', 'b']\n")
    body = "\n".join(f"x{i} = {i}" for i in range(export_lines))
    cells = [
        ("markdown", "# T\n\n> A chapter of the book."),
        ("code", "#| default_exp m"),
        ("code", "#| hide\nimport os"),
    ]
    cells += [("markdown", "What this chapter does.")]
    example = "\n".join(f"assert x{i} == {i}" for i in range(example_lines))
    cells += [("code", f"#| export\n{body}")] + [("code", example)] * examples
    _nb(tmp_path / "nbs" / "00_m.ipynb", cells)
    (tmp_path / "README.md").write_text(readme)
    return tmp_path


def test_cells_are_classified_as_a_reader_sees_them(tmp_path):
    nb = shape.notebook_shape(_project(tmp_path, 30, 2, "Short.\n") / "nbs" / "00_m.ipynb")
    # the hidden import and the default_exp cell are set-up, not examples; directives are not code lines
    assert nb["export_cells"] == [30] and nb["examples"] == 2 and nb["exported_lines"] == 30
    assert nb["other_lines"] == 1 + 2  # `import os` and the two asserts


def test_a_long_cell_and_too_few_examples_are_breaches(tmp_path):
    result = shape.measure(_project(tmp_path, 121, 3, "A short sentence here.\n"))
    text = "\n".join(result["breaches"])
    assert "export cells of [121] lines > 120" in text
    assert "3 example cells for 121 exported lines (need 4)" in text
    assert result["figures"]["public_names"] == 2


def test_a_chapter_within_the_limits_has_no_breach(tmp_path):
    result = shape.measure(_project(tmp_path, 20, 1, "One line of prose.\n", example_lines=6))  # 20 of 27 lines
    assert result["breaches"] == [] and result["figures"]["median_export_cell"] == 20


def test_a_page_opening_with_code_or_a_cut_description_is_a_breach(tmp_path):
    nb = _nb(tmp_path / "00_x.ipynb", [("markdown", "# T\n\n> each as the public"), ("code", "import os")])
    found = shape.notebook_shape(nb)
    assert found["opens_with"] == "example" and found["description"] == "each as the public"
    nb = _nb(
        tmp_path / "00_y.ipynb",
        [("markdown", "# T\n\n> A whole sentence here."), ("code", "#| hide\nimport os"), ("markdown", "Intro.")],
    )
    assert shape.notebook_shape(nb)["opens_with"] == "markdown"


def test_prose_in_the_title_cell_is_a_breach(tmp_path):
    root = _project(tmp_path, 10, 1, "Short.\n", example_lines=4)
    nb = root / "nbs" / "00_m.ipynb"
    cells = json.loads(nb.read_text())
    cells["cells"][0]["source"] = "# T\n\n> A chapter of the book.\n\nAn introduction nbdev would drop."
    nb.write_text(json.dumps(cells))
    assert any("title cell holds prose" in b for b in shape.measure(root)["breaches"])


def test_a_long_readme_sentence_is_a_breach_and_code_is_not_prose(tmp_path):
    long = " ".join(["word"] * 51) + "."
    code = "```bash\n" + " ".join(["arg"] * 80) + "\n```\n"
    result = shape.measure(_project(tmp_path, 10, 1, f"# Title\n\nA short one here.\n\n{code}\n{long}\n"))
    assert result["figures"]["readme_max_words"] == 51
    assert any(b.startswith("README sentence over 50 words") for b in result["breaches"])


def test_the_project_reads_as_chapters():
    result = shape.measure(ROOT)
    assert result["breaches"] == [], "\n".join(result["breaches"])
