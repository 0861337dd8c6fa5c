"""The Book comes first: the designs' chapters are numbered (and listed on the site) before the machinery, and their
code is on the page (`#| exports`), with the forward passes a reader came for."""

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT / "nbs"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


docs, shape = _load("docs"), _load("notebook_shape")


def _module(nb: Path) -> str:
    cells = json.loads(nb.read_text())["cells"]
    src = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    m = re.search(r"^#\|\s*default_exp\s+(\S+)", src, re.M)
    return m.group(1) if m else ""


def test_the_book_comes_before_the_machinery():
    "The designs' chapters are Book pages, numbered before console, config and data, which are reference pages."
    order = [nb for nb in docs.notebooks(NBS) if docs.kind_of(nb) == "library"]
    book = {_module(nb) for nb in order if docs.in_book(nb)}
    assert {"shapes", "layers", "kernels", "model", "looped", "optim", "diagnostics", "scaling", "trainer"} <= book
    assert not {"console", "config", "data", "runs", "cli", "sweep", "slurm"} & book
    first = [_module(nb) for nb in order]
    assert max(first.index(m) for m in book) < min(first.index(m) for m in ("console", "config", "data"))


def test_exports_cells_count_as_exported_and_shown(tmp_path):
    "A `#| exports` cell is exported code (the shape limits count it) that the page shows."
    nb = tmp_path / "00_x.ipynb"
    cell = dict(cell_type="code", source="#| exports\nclass A:\n    def forward(self):\n        return 1\n")
    nb.write_text(json.dumps(dict(cells=[dict(cell_type="markdown", source="# T\n\n> A title."), cell])))
    found = shape.notebook_shape(nb)
    assert found["export_cells"] == [3] and found["examples"] == 0


def test_every_design_s_forward_pass_is_shown():
    "The forward passes of the norm placements, HC, mHC, AttnRes, MoDA and the looped model sit in `exports` cells."
    shown = {}
    for nb in ("01a_model", "01b_looped"):
        for c in json.loads((NBS / f"{nb}.ipynb").read_text())["cells"]:
            s = "".join(c["source"])
            if c["cell_type"] == "code" and s.startswith("#| exports"):
                for name in re.findall(r"^class (\w+)", s, re.M):
                    shown[name] = "def forward(" in s
    designs = ["PreLNBlock", "PeriLNBlock", "LNSBlock", "DeepNormBlock", "KEELBlock", "_HCConnector"]
    designs += ["_MHCConnector", "_MultiStreamTransformer", "_AttnResTransformer", "MoDABlock", "LoopedLM"]
    assert all(shown.get(d) for d in designs), [d for d in designs if not shown.get(d)]


def test_the_design_pages_draw_real_tiny_models():
    """The pages that show the designs' code carry figures (seaborn, shown) of models built by the package: at least
    six on the model and looped pages together, and the diagnostics and scaling chapters draw theirs."""
    drawn = {}
    for nb in ("01a_model", "01b_looped", "03a_diagnostics", "03c_scaling"):
        cells = json.loads((NBS / f"{nb}.ipynb").read_text())["cells"]
        figures = [
            "".join(c["source"])
            for c in cells
            if c["cell_type"] == "code" and "sns." in "".join(c["source"]) and "plt.show()" in "".join(c["source"])
        ]
        drawn[nb] = [f for f in figures if re.search(r"build_model|build_looped|trained\(|paper_accounting", f)]
    assert len(drawn["01a_model"]) + len(drawn["01b_looped"]) >= 6, {k: len(v) for k, v in drawn.items()}
    assert drawn["03a_diagnostics"] and drawn["03c_scaling"], {k: len(v) for k, v in drawn.items()}


def test_no_hidden_cell_makes_up_a_report_figure():
    "The report chapters' made-up diagnostics and synthetic study are built in cells the page shows, not hidden ones."
    for nb, fixture in (("08b_report_depthbench", "def _fake_diagnostics("), ("08c_report_looped", "_syn = ")):
        cells = json.loads((NBS / f"{nb}.ipynb").read_text())["cells"]
        hidden = ["".join(c["source"]) for c in cells if "".join(c["source"]).lstrip().startswith("#| hide")]
        shown = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        assert not any(fixture in s for s in hidden), nb
        assert any(fixture in s for s in shown), nb
