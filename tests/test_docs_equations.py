"""The chapters' equations on the documentation site: LaTeX in a notebook's markdown (`$...$`, `$$...$$`) becomes
MathML, which a browser draws with no script and no network; a dollar sign in prose stays text; an equation that does
not parse fails the build; and every library page whose notebook writes an equation shows it as MathML."""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import docs  # noqa: E402  (scripts/docs.py: the builder)
from test_docs import page_of, site  # noqa: E402, F401, F811  (the built site, shared with the other documentation tests)


@pytest.fixture(scope="module")
def renderer():
    return docs.Renderer("https://example.org/site")


def test_an_inline_equation_becomes_mathml(renderer):
    html = renderer.markdown(r"The rule $N \approx 12 L d^2 + 2 V d$ holds.")
    assert '<math xmlns="http://www.w3.org/1998/Math/MathML" display="inline">' in html
    assert "<msup><mi>d</mi><mn>2</mn></msup>" in html and "$" not in html


def test_a_display_equation_is_a_block(renderer):
    html = renderer.markdown(r"$$L = E + A\,N_{\text{eff}}^{-\alpha} + B\,D^{-\beta}$$")
    assert '<div class="math display"><math' in html and 'display="block"' in html
    assert "<mtext>eff</mtext>" in html
    inside = renderer.markdown(
        r"Sublayer $l$ reads:" + "\n" + r"$$h_l = \sum_{i<l} \alpha_{i\to l} v_i,$$" + "\nwhere ..."
    )
    assert inside.count("<math") == 2 and 'display="block"' in inside and "$" not in inside


def test_dollars_in_prose_stay_text(renderer):
    html = renderer.markdown("It costs $5 and reads $HOME first. Set `$OUT` in code.\n\n```bash\necho $A $B\n```")
    assert "<math" not in html and "$5" in html and "$HOME" in html and "<code>$OUT</code>" in html
    assert "<math" not in html and "$A<span" in html


def test_an_equation_that_does_not_parse_fails_naming_it():
    with pytest.raises(ValueError, match=r"does not parse"):
        docs.equation(r"x^", "inline")
    with pytest.raises(ValueError, match=r"no rendering for: \['\\\\undefinedmacro'\]"):
        docs.equation(r"\undefinedmacro x", "inline")


def test_library_pages_show_their_equations_as_mathml(site):  # noqa: F811
    "A library notebook that writes LaTeX in its prose shows as many MathML equations as it writes, or more."
    missing = []
    for nb in sorted((ROOT / "nbs").glob("0*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        prose = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        prose = re.sub(r"`[^`]*`", "", re.sub(r"```.*?```", "", prose, flags=re.S))
        written = len(re.findall(r"\$\$.+?\$\$|\$[^\s$][^$]*?[^\s$]\$|\$[^\s$]\$", prose, flags=re.S))
        shown = (site / page_of(nb)).read_text().count("<math ")
        if shown < written:
            missing.append(f"{nb.name}: {written} written, {shown} shown")
    assert not missing, missing


def test_arg_min_renders_as_an_operator():
    "latex2mathml lacks `\\arg`: the build writes it as the operator name it is."
    mathml = docs.equation(r"\arg\min_\ell d(z_\ell)", "inline")
    assert "<mo>arg</mo>" in mathml and "<msub><mo>min</mo>" in mathml
