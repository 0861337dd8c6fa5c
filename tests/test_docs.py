"""The documentation site (`bash scripts/docs.sh` -> _docs/), read as its readers read it.

Without a browser: the index notebook agrees with README.md (the intro, the two commands, the notebook map), every
exported function and class has a docstring, every notebook is a page, every exported name has an entry on its module's
page, the library pages show their examples' outputs, the report pages their figures with their scale, and no internal
link is broken. In Debian's headless Chromium (as tests/test_jupyterlab.py drives JupyterLab): the index renders, a
module page shows a function's signature, the search box finds `register_design`, a report page shows its figures.
Screenshots are kept in .cache/test-artifacts/.

The site is built once (scripts/docs.sh, which the test command runs before pytest) and reused while nothing it is built
from has changed; otherwise the first test that needs it builds it."""

import fcntl
import functools
import http.server
import importlib
import json
import os
import re
import socketserver
import subprocess
import sys
import threading
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "_docs"
NBS = ROOT / "nbs"
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
import docs  # noqa: E402  (scripts/docs.py: the builder)
from test_jupyterlab import ARTIFACTS, _browser_or_skip, _chromium  # noqa: E402


def page_of(nb: Path) -> str:
    "The page nbdev names after a notebook: the number prefix dropped (nbs/05e_checks.ipynb -> checks.html)."
    return re.sub(r"^\d+[a-zA-Z0-9]*_", "", nb.stem.lower()) + ".html"


def module_pages() -> dict[str, str]:
    "Exported module -> its page, from each notebook's default_exp."
    out = {}
    for nb in sorted(NBS.glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            m = re.search(r"^#\|\s*default_exp\s+(\S+)", "".join(cell["source"]), re.M)
            if cell["cell_type"] == "code" and m:
                out[m.group(1)] = page_of(nb)
    return out


# ------------------------------------------------------------------------------------------------------------------
# The index page and README agree (README is written by hand; nbs/index.ipynb is the site's front page)
# ------------------------------------------------------------------------------------------------------------------
def _readme_section(text: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f'README.md has no section "## {title}"'
    return m.group(1)


def _plain(md: str) -> str:
    "Markdown without links' targets and code backticks, whitespace collapsed: what a reader reads."
    md = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", md)
    return re.sub(r"\s+", " ", md.replace("`", "")).strip()


def _table(md: str) -> list[list[str]]:
    return [
        [_plain(c) for c in line.strip().strip("|").split(" | ")]
        for line in md.splitlines()
        if line.startswith("|") and not re.match(r"^\|[-| ]+\|$", line.strip())
    ]


def _code_blocks(md: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```\w*\n(.*?)```", md, re.S)]


def index_markdown() -> str:
    nb = json.loads((NBS / "index.ipynb").read_text())
    assert all(c["cell_type"] == "markdown" for c in nb["cells"]), "nbs/index.ipynb is prose: markdown cells only"
    return "\n\n".join("".join(c["source"]) for c in nb["cells"])


# a measured time or rate in prose ("477 s wall", "0.68M tokens/s", "load average"): such figures belong on the
# Performance page, built from the benchmarks' output, not on the front pages
MACHINE_FIGURE = re.compile(
    r"\b\d[\d,.]*\s?(?:s|ms|min|minutes|seconds|h|hours|GB/s|MB/s|M? ?tokens/s|it/s)\b|load average|\d\s?x faster",
)


def manual_notebooks() -> list[Path]:
    "The manual's pages that are notebooks (a page without a number, such as Performance), in the sidebar's order."
    return [nb for nb in docs.notebooks(NBS) if docs.kind_of(nb) == "manual"]


def manual_titles() -> list[str]:
    "The manual's page titles in the sidebar's order: the .qmd pages, then the manual's notebooks."
    qmd = [docs.front_matter(p.read_text())[0]["title"] for p in docs.manual_sources(NBS)]
    return qmd + [json.loads(nb.read_text())["cells"][0]["source"][0].strip("# \n") for nb in manual_notebooks()]


def _prose(md: str) -> str:
    "Markdown without its code blocks."
    return re.sub(r"```.*?```", " ", md, flags=re.S)


def test_index_agrees_with_readme():
    readme, index = (ROOT / "README.md").read_text(), index_markdown()
    # what the project is: README's opening paragraphs, word for word
    intro = readme.split("\n## ")[0].split("\n", 1)[1]
    assert _plain(intro) in _plain(index), "the opening of nbs/index.ipynb differs from README.md's: copy it over"
    # the two commands, as README gives them
    commands = _code_blocks(_readme_section(readme, "The two commands"))
    assert commands == ["bash scripts/setup.sh && .venv/bin/depthbench-nb demo", "bash scripts/test.sh"], commands
    assert all(c in _code_blocks(index) for c in commands), "nbs/index.ipynb lacks one of README's two commands"
    # the two papers, by arXiv id and official code
    for ref in ("arXiv 2609.32534", "keyu-wang-2002/DepthBench", "arXiv 2604.21106", "kschwethelm/looped-lm-scaling"):
        assert ref in readme and ref in index, ref
    # the manual: the same pages in the same order, each a page the site builds
    manual = _plain(_readme_section(readme, "Where to read next").split("The manual:")[1])
    assert manual == _plain(index.split("## The manual")[1].split("\n## ")[0]), "the manual lists differ"
    titles = re.findall(r"^- \[([^\]]+)\]", _readme_section(readme, "Where to read next"), re.M)
    assert titles == manual_titles(), titles
    # the map of the notebooks: README's table, row for row, and it names every notebook there is
    tour = _table(_readme_section(readme, "A tour of the notebooks"))
    mine = _table(index.split("## A map of the notebooks")[1])
    assert mine == tour, 'the notebook map of nbs/index.ipynb differs from README\'s "A tour of the notebooks": ' + str(
        [r for r in tour if r not in mine] + [r for r in mine if r not in tour]
    )
    named = {n.strip() for row in tour[1:] for n in row[0].split(",")}
    chapters = {p.stem for p in NBS.glob("*.ipynb") if docs.kind_of(p) not in ("index", "manual")}
    assert named == chapters, named ^ chapters
    # how to build and look at the site, in both
    for doc in (readme, index):
        assert "bash scripts/docs.sh" in doc and "python -m http.server -d _docs" in doc
    # no machine figures in either one's prose
    for name, doc in (("README.md", readme), ("nbs/index.ipynb", index)):
        found = MACHINE_FIGURE.findall(_prose(doc))
        assert not found, f"{name} quotes machine figures {found}: they belong on the Performance page"


def test_machine_figure_pattern_finds_timings():
    prose = "Measured on a 2-core machine: 477 s wall (887 s CPU), 0.68M tokens/s, load average 0.7; 1.5x faster."
    assert MACHINE_FIGURE.findall(prose) == ["477 s", "887 s", "0.68M tokens/s", "load average", "5x faster"]
    assert not MACHINE_FIGURE.findall(_prose("7,600 steps of 512 × 2048 tokens\n```\nsleep 5 s\n```"))


# ------------------------------------------------------------------------------------------------------------------
# README's links: each one leads somewhere
# ------------------------------------------------------------------------------------------------------------------
def site_url() -> str:
    from nbdev.config import get_config

    cfg = get_config()
    return (cfg.doc_host + cfg.doc_baseurl).rstrip("/") + "/"


def site_pages() -> set[str]:
    "The pages scripts/docs.py builds: one per notebook, one per manual page."
    return {docs.page_name(nb) for nb in docs.notebooks(NBS)} | {f"{p.stem}.html" for p in docs.manual_sources(NBS)}


def github_slug(heading: str) -> str:
    "A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def markdown_links(md: str) -> list[str]:
    "The targets of a markdown text's links and images, code blocks and code spans left out."
    text = re.sub(r"`[^`\n]*`", "", _prose(md))
    return [m.group(2) for m in re.finditer(r"!?\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)]


def readme_link_problems(readme: Path, site: Path | None = None) -> list[str]:
    """Links of a README that lead nowhere: a file of the repository that is missing, an `#anchor` that is no heading
    of its file, a page of the documentation site that the build does not make (or, given the built site, a page or
    anchor missing from it). Other web addresses are not followed."""
    text, url, pages, bad = readme.read_text(), site_url(), site_pages(), []
    for link in markdown_links(text):
        u = urlsplit(link)
        if link.startswith(url) or link.rstrip("/") + "/" == url:
            page = link[len(url) :].split("#")[0] or "index.html"
            if page not in pages:
                bad.append(f"{link}: no such page of the documentation site")
            elif site is not None and not (site / page).is_file():
                bad.append(f"{link}: not in the built site")
            elif site is not None and u.fragment and unquote(u.fragment) not in Page(site / page).ids:
                bad.append(f"{link}: no such anchor in the built site")
            continue
        if u.scheme or u.netloc:
            continue  # another site: not followed
        target = (readme.parent / unquote(u.path)).resolve() if u.path else readme
        if not target.exists():
            bad.append(f"{link}: no such file")
        elif u.fragment and target.suffix in (".md", ".qmd"):
            headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", _prose(target.read_text()), re.M)
            if unquote(u.fragment) not in {github_slug(h) for h in headings}:
                bad.append(f"{link}: no such heading")
    return bad


def test_readme_links_resolve():
    links = markdown_links((ROOT / "README.md").read_text())
    assert len(links) >= 10 and any(link.startswith("nbs/manual/") for link in links), links
    bad = readme_link_problems(ROOT / "README.md")
    assert not bad, "README.md has broken links:\n" + "\n".join(bad)


def test_readme_link_check_finds_broken_links(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("# Here\n\n## A section\n")
    url = site_url()
    (tmp_path / "README.md").write_text(
        "# Title\n\n## The two commands\n\n"
        "[ok](docs/here.md) [ok](docs/here.md#a-section) [ok](#the-two-commands) [ok](#title) "
        f"[ok]({url}model.html) [ok]({url}reliability.html) [ok](https://example.org/x)\n"
        "[bad](docs/gone.md) [bad](docs/here.md#no-section) [bad](#no-heading) "
        f"[bad]({url}no_page.html) ![bad](docs/missing.png)\n\n"
        "```bash\n[not a link](nowhere.md)\n```\n"
    )
    assert readme_link_problems(tmp_path / "README.md") == [
        "docs/gone.md: no such file",
        "docs/here.md#no-section: no such heading",
        "#no-heading: no such heading",
        f"{url}no_page.html: no such page of the documentation site",
        "docs/missing.png: no such file",
    ]


def test_readme_site_links_are_in_the_built_site(site):
    bad = readme_link_problems(ROOT / "README.md", site)
    assert not bad, "README.md links pages the built site lacks:\n" + "\n".join(bad)


def test_exported_functions_and_classes_have_docstrings():
    """show_doc shows a docstring under every signature: none may be missing (a dataclass's generated one does not
    count)."""
    import inspect

    missing = []
    for mod_name in module_pages():
        mod = importlib.import_module(f"depthbench_nb.{mod_name}")
        for name in mod.__all__:
            obj = getattr(mod, name)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
            if not (doc or "").strip() or (inspect.isclass(obj) and doc.startswith(f"{name}(")):
                missing.append(f"{mod_name}.{name}")
    assert not missing, f"{len(missing)} exported functions/classes without a docstring: {missing}"


# ------------------------------------------------------------------------------------------------------------------
# The manual: nbs/manual/*.qmd rendered by scripts/docs.py beside the notebooks
# ------------------------------------------------------------------------------------------------------------------
MANUAL_PAGES = [
    "preparing_data",
    "reliability",
    "clusters",
    "transformers",
    "testing",
    "contributing",
    "adding_a_design",
    "exit_codes",
]


def test_manual_pages_have_a_title_and_a_one_sentence_description():
    sources = docs.manual_sources(NBS)
    assert [p.stem for p in sources][: len(MANUAL_PAGES)] == MANUAL_PAGES
    for p in sources:
        front, body = docs.front_matter(p.read_text())
        assert front.get("title") and not body.lstrip().startswith("# "), p.name  # the title is the page's only h1
        description = front.get("description", "")
        assert description.endswith(".") and description.count(". ") == 0, (p.name, description)


@pytest.fixture(scope="module")
def manual_site(tmp_path_factory):
    "The manual's pages rendered alone (no notebook processed), as scripts/docs.py renders them into the site."
    from nbdev.config import get_config

    out = tmp_path_factory.mktemp("manual-site")
    site = docs.Site(out / "no_notebooks", out / "_docs", get_config())
    site.write()
    return site, out / "_docs"


def test_manual_pages_render_with_sidebar_contents_and_search(manual_site):
    site, out = manual_site
    assert [p.name for p in site.pages] == [f"{n}.html" for n in MANUAL_PAGES]
    search = json.loads((out / "search.json").read_text())
    for page in site.pages:
        html = (out / page.name).read_text()
        sidebar = html.split('<nav class="sidebar"')[1].split("</nav>")[0]
        assert '<div class="sidebar-section">Manual</div>' in sidebar
        assert all(f'href="{n}.html"' in sidebar for n in MANUAL_PAGES), page.name
        toc = html.split('<nav class="toc">')[1].split("</nav>")[0] if '<nav class="toc">' in html else ""
        h2 = [hid for lvl, hid, _ in page.headings if lvl == 2]
        assert h2 and all(f'href="#{hid}"' in toc for hid in h2), page.name  # every section in "On this page"
        assert '<h1 class="title">' in html and "<h1 " not in html.split('<h1 class="title">')[1]
        sections = {e["href"] for e in search if e["href"].split("#")[0] == page.name}
        assert {f"{page.name}#{hid}" for hid in h2} <= sections, page.name
        assert all(e["crumbs"] == ["Manual"] for e in search if e["href"].split("#")[0] == page.name)


def test_manual_links_lead_to_pages_of_the_site(manual_site):
    """Every internal link of the manual resolves, but those to the notebooks' pages, which this site lacks: those
    must name a page the full build makes (the full build checks them all, test_no_broken_internal_link)."""
    _, out = manual_site
    notebook_pages = {docs.page_name(nb) for nb in docs.notebooks(NBS)}
    bad = [
        b
        for b in internal_link_problems(out)
        if not re.match(r".+ -> ([\w.-]+\.html)(#\S*)?: no such file", b)
        or re.match(r".+ -> ([\w.-]+\.html)", b).group(1) not in notebook_pages
    ]
    assert not bad, bad
    links = [link for p in out.glob("*.html") for link in Page(p).links]
    assert "model.html" in links and "reliability.html" in links  # notebooks and pages by their site names
    left = [link for link in links if link.endswith((".qmd", ".ipynb")) and not urlsplit(link).scheme]
    assert not left, f"links left with their sources' names: {left}"


def test_manual_link_names_notebooks_and_pages_as_the_site_does():
    source = NBS / "manual" / "testing.qmd"
    assert docs.manual_link("../01a_model.ipynb", source, NBS) == "model.html"
    assert docs.manual_link("reliability.qmd#one-writer-per-run", source, NBS) == "reliability.html#one-writer-per-run"
    assert docs.manual_link("performance.html", source, NBS) is None  # a site page: left as written
    assert docs.manual_link("https://example.org/a.qmd", source, NBS) is None


def test_contributing_worked_example_runs_as_shown():
    """The three cells of Contributing's worked example: an export cell, its markdown with the equation, an example;
    run as a notebook runs them, the example gives the output the page shows."""
    import math

    import torch
    import torch.nn.functional as F
    from fastcore.test import test_close

    page = (NBS / "manual" / "contributing.qmd").read_text()
    cells = json.loads(re.search(r"```json\n(.*?)```", page, re.S).group(1))
    assert [c["cell_type"] for c in cells] == ["code", "markdown", "code"]
    export, prose, example = ("".join(c["source"]) for c in cells)
    assert export.startswith("#| export\n") and "$$" in prose and "arXiv" in prose and "test_close" in example
    # the definition is the package's own, cell for cell (nbs/03a_diagnostics.ipynb), not one made up for the page
    chapter = json.loads((NBS / "03a_diagnostics.ipynb").read_text())["cells"]
    assert export in ["".join(c["source"]) for c in chapter if c["cell_type"] == "code"], "not a cell of 03a"
    from typing import Sequence

    from depthbench_nb.config import ConfigError

    ns = dict(math=math, torch=torch, F=F, Tensor=torch.Tensor, Sequence=Sequence, ConfigError=ConfigError)
    ns.update(test_close=test_close)
    exec(export, ns)
    *body, last = example.splitlines()
    exec("\n".join(body), ns)
    shown = re.findall(r"```\n(tensor\(.*?\))\n```", page)
    assert shown == [repr(eval(last, ns))], shown
    # the rendered half shows the same code and prose
    rendered = page.split('<div class="rendered-example">')[1]
    assert example in rendered and prose.replace("\\\\", "\\") in rendered


def test_manual_is_plain_prose():
    "Short sentences, as README's: a median of at most 20 words and none over 50 on every page."
    import statistics

    sys.path.insert(0, str(ROOT / "scripts"))
    from notebook_shape import _sentences

    for p in docs.manual_sources(NBS):
        words = [len(s.split()) for s in _sentences(docs.front_matter(p.read_text())[1])]
        assert statistics.median(words) <= 20 and max(words) <= 50, (p.name, statistics.median(words), max(words))


# ------------------------------------------------------------------------------------------------------------------
# The built site
# ------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def site():
    """The built site: reused while its inputs are unchanged, else built here (one build, whatever the number of
    workers)."""

    def fresh():
        stamp = SITE / ".build.json"
        return stamp.exists() and json.loads(stamp.read_text()).get("inputs") == docs.inputs_digest()

    if not fresh():
        (ROOT / ".cache").mkdir(exist_ok=True)
        with open(ROOT / ".cache" / "docs-build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not fresh():
                done = subprocess.run(
                    ["bash", str(ROOT / "scripts" / "docs.sh")], cwd=ROOT, capture_output=True, text=True
                )
                assert done.returncode == 0, f"scripts/docs.sh failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert fresh()
    return SITE


class Page(HTMLParser):
    "The ids, links, images and text of one HTML page (an independent reading of what scripts/docs.py wrote)."

    def __init__(self, path: Path):
        super().__init__(convert_charrefs=True)
        self.ids, self.links, self.imgs, self.classes, self.text = set(), [], [], [], []
        self.feed(path.read_text())

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "a" and "href" in a:
            self.links.append(a["href"])
        if tag in ("img", "script", "link") and (a.get("src") or a.get("href")):
            self.links.append(a.get("src") or a.get("href"))
        if tag == "img":
            self.imgs.append(a.get("src"))
        self.classes.append(a.get("class") or "")

    def handle_data(self, data):
        self.text.append(data)


def internal_link_problems(site: Path) -> list[str]:
    pages = {p.resolve(): Page(p) for p in site.rglob("*.html")}
    bad = []
    for path, page in pages.items():
        for link in page.links:
            u = urlsplit(link)
            if u.scheme or u.netloc or link.startswith(("mailto:", "data:", "javascript:")):
                continue
            target = (path.parent / unquote(u.path)).resolve() if u.path else path
            if not target.is_file() or site.resolve() not in target.parents:
                bad.append(f"{path.name} -> {link}: no such file")
            elif u.fragment and target.suffix == ".html" and unquote(u.fragment) not in pages[target].ids:
                bad.append(f"{path.name} -> {link}: no such anchor")
    return bad


def test_link_checker_finds_a_broken_link(tmp_path):
    (tmp_path / "a.html").write_text(
        '<a href="b.html#here">ok</a><a href="b.html#gone">x</a><a href="c.html">y</a>'
        '<img src="a_files/f.png"><a href="https://example.org/x">out</a>'
    )
    (tmp_path / "b.html").write_text('<h2 id="here">Here</h2>')
    assert internal_link_problems(tmp_path) == [
        "a.html -> b.html#gone: no such anchor",
        "a.html -> c.html: no such file",
        "a.html -> a_files/f.png: no such file",
    ]


def test_no_broken_internal_link(site):
    bad = internal_link_problems(site)
    assert not bad, f"{len(bad)} broken internal links:\n" + "\n".join(bad[:50])


def test_every_notebook_is_a_page_and_searchable(site):
    notebooks = sorted(NBS.glob("*.ipynb"))
    assert (site / "index.html").is_file()
    missing = [nb.name for nb in notebooks if not (site / page_of(nb)).is_file()]
    assert not missing, missing
    entries = json.loads((site / "search.json").read_text())
    assert {"objectID", "href", "title", "section", "text"} <= set(entries[0])
    searched = {e["href"].split("#")[0] for e in entries}
    assert searched >= {page_of(nb) for nb in notebooks}, {page_of(nb) for nb in notebooks} - searched
    manual = {f"{p.stem}.html" for p in docs.manual_sources(NBS)}
    assert manual and all((site / p).is_file() for p in manual) and searched >= manual, manual - searched


def test_every_exported_name_has_a_doc_entry(site):
    "Every name in a module's __all__ has an entry (an anchor) on the module's page: show_doc or the constants table."
    missing = []
    for mod_name, page in module_pages().items():
        ids = Page(site / page).ids
        mod = importlib.import_module(f"depthbench_nb.{mod_name}")
        missing += [f"{mod_name}.{n} ({page})" for n in mod.__all__ if n.lower() not in ids]
    assert not missing, f"{len(missing)} exported names without a doc entry: {missing}"


def test_library_pages_show_executed_examples(site):
    "Each library page shows its examples run: outputs of code cells, not only show_doc entries."
    build = json.loads((site / ".build.json").read_text())
    empty = []
    for nb in sorted(NBS.glob("0*.ipynb")):
        page = Page(site / page_of(nb))
        if not any(c.startswith("cell-output") for c in page.classes):
            empty.append(nb.name)
        assert nb.name in build["timings"], nb.name
    assert not empty, f"library pages without any executed output: {empty}"


def test_report_pages_show_figures_labelled_with_their_scale(site):
    """The report pages show the reports' own figures, each under its caption: the figures the report wrote (whose title
    carries the study's scale label, Report.figure), on the demo's records, whose scale label the page prints first."""
    report_dir = docs.BUILD / "runs" / "demo" / "report"
    written = {f.read_bytes(): f.name for f in report_dir.glob("*.png")}
    for page in ("depthbench_report.html", "looped_report.html"):
        html = (site / page).read_text()
        figures = re.findall(r'<div class="cell-output figure"><img src="([^"]+)"', html)
        assert len(figures) >= 5, (page, len(figures))
        # each one is a figure the report wrote (and so labelled with the scale), not a stale or foreign image
        shown = [written.get((site / src).read_bytes()) for src in figures]
        assert None not in shown and len(set(shown)) == len(shown), (page, shown)
        # each comes under its caption (a bold line), as show_artifact displays it
        captions = re.findall(
            r'<div class="cell-output markdown"><p>(.+?)</p>\s*</div>\s*<div class="cell-output figure">', html
        )
        assert len(captions) == len(figures), (page, len(captions), len(figures))
        # the page says whose records these are and at which scale: the demo's tiny runs, not comparable with the paper
        text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))
        assert "the CPU demo's run records" in text
        assert re.search(r"NOT comparable", text) and "tiny" in text, page


# ------------------------------------------------------------------------------------------------------------------
# In headless Chromium
# ------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser(site, tmp_path_factory):
    "The site served over HTTP on loopback (the search fetches search.json) and a headless Chromium reading it."
    _browser_or_skip()
    os.environ["SE_OFFLINE"] = "true"  # Selenium must not look for drivers on the network: both are given

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    driver = _chromium(tmp_path_factory.mktemp("chromium-profile"))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        driver.quit()
        server.shutdown()
        server.server_close()


def _wait(driver, what: str, cond, timeout: float = 30):
    end = time.time() + timeout
    while time.time() < end:
        try:
            if v := cond():
                return v
        except Exception:
            pass
        time.sleep(0.2)
    driver.save_screenshot(str(ARTIFACTS / "docs_failed.png"))
    raise AssertionError(f"timed out waiting for {what} (screenshot: docs_failed.png)")


def test_browser_index_renders(browser):
    from selenium.webdriver.common.by import By

    driver, url = browser
    driver.get(f"{url}/index.html")
    title = _wait(driver, "the title", lambda: driver.find_element(By.CSS_SELECTOR, "h1.title"))
    assert title.text == "depthbench-nb" and title.is_displayed()
    sidebar = driver.find_elements(By.CSS_SELECTOR, "nav.sidebar a")
    chapters = [page_of(nb) for nb in docs.notebooks(NBS) if docs.kind_of(nb) != "manual"]
    book = [page_of(nb) for nb in docs.notebooks(NBS) if docs.in_book(nb)]
    manual = [f"{p.stem}.html" for p in docs.manual_sources(NBS)] + [page_of(nb) for nb in manual_notebooks()]
    # the front page, the Book, the manual, then the reference chapters, templates and reports in the notebooks' order
    rest = [c for c in chapters[1:] if c not in book]
    assert [a.get_attribute("href").rsplit("/", 1)[1] for a in sidebar] == chapters[:1] + book + manual + rest
    assert all(a.is_displayed() for a in sidebar)
    # the map of the notebooks links every notebook's page, and the styles are in use (the navbar is coloured)
    links = {
        a.get_attribute("href").rsplit("/", 1)[1] for a in driver.find_elements(By.CSS_SELECTOR, "#content table a")
    }
    # (the Performance notebook is a manual page: the manual list links it, not the notebook map)
    assert {page_of(nb) for nb in NBS.glob("*.ipynb") if docs.kind_of(nb) not in ("index", "manual")} <= links
    assert (
        driver.find_element(By.CSS_SELECTOR, "header.navbar").value_of_css_property("background-color")
        != "rgba(0, 0, 0, 0)"
    )
    driver.save_screenshot(str(ARTIFACTS / "docs_index.png"))


def test_browser_module_page_shows_a_signature(browser):
    from selenium.webdriver.common.by import By

    driver, url = browser
    driver.get(f"{url}/config.html#register_design")
    heading = _wait(driver, "the register_design entry", lambda: driver.find_element(By.ID, "register_design"))
    assert heading.tag_name == "h3" and heading.text.strip() == "register_design" and heading.is_displayed()
    entry = heading.find_element(By.XPATH, './ancestor::div[contains(@class, "doc-entry")]')
    signature = entry.find_element(By.CSS_SELECTOR, "pre").text
    assert re.search(
        r"register_design\(\s*design:\s*Design,\s*overwrite:\s*bool\s*=\s*False\s*\)\s*->\s*Design", signature
    ), signature
    assert "Add a design to the registry" in entry.text  # the docstring under it
    source = entry.find_element(By.LINK_TEXT, "source").get_attribute("href")  # the line in the exported module
    assert re.search(r"/blob/main/depthbench_nb/config\.py#L\d+$", source), source
    driver.save_screenshot(str(ARTIFACTS / "docs_config_register_design.png"))


def test_browser_search_finds_register_design(browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver, url = browser
    driver.get(f"{url}/index.html")
    box = _wait(driver, "the search box", lambda: driver.find_element(By.ID, "search-input"))
    box.click()
    box.send_keys("register_design")

    # the results are redrawn at each key typed: read them once they answer the whole word (a stale read is retried)
    def first():
        return driver.find_elements(By.CSS_SELECTOR, "#search-results a.search-result")[0]

    _wait(
        driver,
        "config.html#register_design as the first result",
        lambda: (
            first().get_attribute("href").endswith("/config.html#register_design") and "register_design" in first().text
        ),
    )
    driver.save_screenshot(str(ARTIFACTS / "docs_search.png"))
    box.send_keys(Keys.ENTER)  # the first result, as a reader would open it
    _wait(driver, "the result page", lambda: driver.current_url.endswith("/config.html#register_design"))
    assert _wait(driver, "the entry", lambda: driver.find_element(By.ID, "register_design")).is_displayed()


@pytest.mark.parametrize("page", ["depthbench_report.html", "looped_report.html"])
def test_browser_report_page_shows_its_figures(browser, page):
    from selenium.webdriver.common.by import By

    driver, url = browser
    driver.get(f"{url}/{page}")
    _wait(driver, "the figures", lambda: driver.find_elements(By.CSS_SELECTOR, ".cell-output.figure img"))
    imgs = driver.find_elements(By.CSS_SELECTOR, ".cell-output.figure img")
    assert len(imgs) >= 5

    def loaded():
        return all(
            driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 100", i) for i in imgs
        )

    _wait(driver, "every figure to load", loaded)
    assert all(i.size["width"] > 100 for i in imgs)  # shown, not collapsed
    driver.execute_script('arguments[0].scrollIntoView({block: "center"})', imgs[0])
    driver.save_screenshot(str(ARTIFACTS / f"docs_{page.replace('.html', '')}.png"))
