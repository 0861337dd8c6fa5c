"""Build the documentation site into _docs/ (`bash scripts/docs.sh`): a page per notebook of nbs/, index first.

The notebooks are processed by nbdev 2 exactly as `nbdev_docs` processes them (its processors: frontmatter from the
title cell, `show_doc` for every exported function and class, directives, exported cells hidden, links to the API), with
two additions:

- every code cell runs, not only the cells `show_doc` needs, so a page shows its examples with their outputs; the cells
  flagged with settings.ini's `tst_flags` (`slow`, `gpu`) are shown without running, as `nbdev_test` skips them, and the
  page says so; the papermill templates (10-19) are shown, not run. A cell that raises fails the build: the build is
  the notebooks' test (the test command runs each notebook once, here, and not again in `nbdev_test`);
- each page lists the module's exported constants (name, type, value, the comment beside it), as `show_doc` lists its
  functions and classes, so every exported name has an entry.

The report notebooks (20-29) run on the CPU demo's run records shipped in docs/example_study/ (tiny scale: the reports
label every table and figure with it). A notebook whose cells take longer than the time budget fails the build: the
pages' examples must stay small and fast.

`nbdev_docs` would hand the processed notebooks to Quarto. Quarto cannot be installed on a machine that reaches only
the package registries (PyPI's `quarto-cli` downloads its binaries from GitHub while it installs), so this script
renders them itself: static HTML pages with a sidebar in the notebooks' order, an "on this page" contents, figures as
files, and a search box over `search.json` (Quarto's format: one entry per section). Every internal link is checked
before the build succeeds.
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ASSETS = Path(__file__).resolve().parent / "docs_site"
EXAMPLE_STUDY = ROOT / "docs" / "example_study"
BUILD = ROOT / ".cache" / "docs-build"  # the example study's run records are copied here (reports write beside them)
SECTIONS = (("Library", "0"), ("Papermill templates", "1"), ("Reports", "2"))


# ----------------------------------------------------------------------------------------------------------------------
# Which notebooks, and what kind of page each is
# ----------------------------------------------------------------------------------------------------------------------
def notebooks(nbs: Path) -> list[Path]:
    "The notebooks that become pages: index first, then the numbered notebooks in the order of their numbers."
    found = sorted(p for p in nbs.glob("*.ipynb") if not p.name.startswith(("_", ".")))
    return sorted(found, key=lambda p: (p.name != "index.ipynb", p.name))


def kind_of(nb_path: Path) -> str:
    "index, library (the Book 00-04, the reference 05-09), template (10-19), report (20-29) or manual (Performance)."
    if nb_path.stem == "index":
        return "index"
    return {"0": "library", "1": "template", "2": "report"}.get(nb_path.name[0], "manual")


BOOK_END = "05"  # library notebooks numbered below this are the Book (the designs); the rest is the reference machinery


def in_book(nb_path: Path) -> bool:
    "Whether a library notebook is a Book chapter (00-04: the papers' subject) rather than a reference chapter (05-09)."
    return kind_of(nb_path) == "library" and nb_path.name < BOOK_END


def page_name(nb_path: Path) -> str:
    "The page's file name, as nbdev names it (and links to it): the number prefix dropped."
    from nbdev.doclinks import _nbpath2html

    return _nbpath2html(Path(nb_path.name)).name


# ----------------------------------------------------------------------------------------------------------------------
# nbdev's processing, every cell run
# ----------------------------------------------------------------------------------------------------------------------
REPORT_PARAMETERS = {
    "20_depthbench_report": dict(study="demo"),
    # a lighter fitting effort than the paper's (500 starts, 200 x 501-start resamples) to keep the
    # build short: the page states the effort it used
    "21_looped_report": dict(study="demo", restarts=100, n_bootstrap=20, bootstrap_restarts=100, workers=2),
}


# show_doc evaluates string annotations (`from __future__ import annotations`) in the defining namespace; one that names
# a module imported only inside functions (torch in runs.py, say) raises NameError there: show it as written instead
# (names kept in a closure: the notebook's own globals may rebind any name)
SIGNATURE_FALLBACK = """
def _docs_signature_fallback():
    import inspect, fastcore.docments
    def signature(obj, *args, eval_str=False, **kwargs):
        try: return inspect.signature(obj, *args, eval_str=eval_str, **kwargs)
        except NameError: return inspect.signature(obj, *args, **kwargs)
    fastcore.docments.signature = signature
_docs_signature_fallback()
del _docs_signature_fallback
"""


def _procs(nb_path: Path, kind: str, skip_flags: set, budget: float):
    "nbdev's documentation processors (FilterDefaults), with `show_doc` cells in definition order and every cell run."
    from execnb.nbio import mk_cell
    from fastcore.foundation import L
    from nbdev.process import NbCell
    from nbdev.processors import (
        FilterDefaults,
        _def_names,
        _get_nm,
        _show_docs,
        _want_doc,
        add_show_docs,
        exec_show_docs,
        strip_ansi,
    )

    class show_docs_in_order(add_show_docs):
        """nbdev's add_show_docs, with each exported cell's entries in the order the cell defines them (nbdev reverses
        them)."""

        def begin(self):
            nb = self.nb
            exports = L(cell for cell in nb.cells if _want_doc(cell))
            shown = {_get_nm(t) for t in _show_docs(L(nb.cells).map(NbCell.parsed_).concat())}
            for cell in reversed(exports):
                for nm in reversed(_def_names(cell, shown)):
                    new_cell = mk_cell(f"show_doc({nm})")
                    new_cell.has_sd = True
                    nb.cells.insert(cell.idx_ + 1, new_cell)
            nb.has_docs_ = shown or exports

    class run_cells(exec_show_docs):
        "Run every code cell of the page (nbdev runs only those show_doc needs), except flagged ones; time each."

        def begin(self):
            super().begin()
            if not hasattr(self, "k"):
                return
            self.k.timeout = int(budget)
            self.k.run_cell(SIGNATURE_FALLBACK)

        def __call__(self, cell):
            if not hasattr(self, "k") or cell.cell_type != "code" or not cell.source.strip():
                return
            flags = sorted(cell.directives_.keys() & skip_flags)
            if kind == "template":
                flags = ["template"]
            if cell.directives_.get("eval:", [""])[0].lower() == "false":
                flags = ["eval: false"]
            if flags:
                cell.metadata["docs_not_run"] = flags[0]
                return
            start = time.time()
            self.k.cell(cell)
            cell.metadata["docs_seconds"] = round(time.time() - start, 3)
            if self.k.exc:
                raise RuntimeError(
                    f"cell {cell.idx_} failed:\n{cell.source}\n{self.k.prettytb(fname=nb_path)}"
                ) from self.k.exc

    procs = []
    for p in FilterDefaults().base_procs():
        if p is strip_ansi:
            continue  # outputs exist only after the run: stripped when rendered
        procs.append({add_show_docs: show_docs_in_order, exec_show_docs: run_cells}.get(p, p))
    return procs


def _inject_parameters(nb, parameters: dict) -> None:
    """Add the page's parameters after the `parameters` cell, as papermill does (a visible cell saying what the page
    shows)."""
    from execnb.nbio import mk_cell
    from fastcore.basics import AttrDict

    idx = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    lines = [
        "# Parameters of this page: the CPU demo's run records shipped with the documentation (docs/example_study/)"
    ]
    lines += [f"{k} = {v!r}" for k, v in parameters.items()]
    cell = mk_cell("\n".join(lines))
    cell.metadata = AttrDict(tags=["injected-parameters"])
    nb.cells.insert(idx + 1, cell)


def process_notebook(nb_path: Path, proc_dir: Path, runs_root: Path, budget: float) -> dict:
    "Process one notebook into the _proc folder (in a process of its own, as nbdev_test runs one); returns its timings."
    os.environ["DEPTHBENCH_RUNS"] = str(runs_root)
    os.environ["IN_TEST"] = "1"  # as nbdev_test sets it: this build is where the notebooks' tests run
    from execnb.nbio import read_nb, write_nb
    from nbdev.config import get_config
    from nbdev.process import NBProcessor

    skip_flags = set(get_config().get("tst_flags", "").split())
    kind = kind_of(nb_path)
    start = time.time()
    nb = read_nb(nb_path)
    if nb_path.stem in REPORT_PARAMETERS:
        _inject_parameters(nb, REPORT_PARAMETERS[nb_path.stem])
    os.chdir(nb_path.parent)  # as nbdev_test runs a notebook
    module = next(
        (
            m.group(1)
            for c in nb.cells
            if c.cell_type == "code"
            for m in [re.search(r"^#\|\s*default_exp\s+(\S+)", "".join(c.source), re.M)]
            if m
        ),
        None,
    )
    procs = _procs(nb_path, kind, skip_flags, budget)
    if module:
        procs.insert(
            procs.index(next(p for p in procs if p.__name__ == "show_docs_in_order")) + 1, constants_table(module)
        )
    try:
        NBProcessor(nb=nb, procs=procs).process()
    except Exception as e:
        return dict(notebook=nb_path.name, error=f"{type(e).__name__}: {e}", seconds=time.time() - start)
    finally:
        os.chdir(ROOT)
    nb.metadata["docs"] = dict(kind=kind, module=module, notebook=nb_path.name)
    write_nb(nb, Path(proc_dir) / nb_path.name)
    cells = sorted(
        ((c.metadata.get("docs_seconds", 0), c.idx_) for c in nb.cells if c.cell_type == "code"), reverse=True
    )
    return dict(
        notebook=nb_path.name,
        seconds=time.time() - start,
        cells_run=sum("docs_seconds" in c.metadata for c in nb.cells),
        slowest=cells[:3],
        not_run=sum("docs_not_run" in c.metadata for c in nb.cells),
    )


# ----------------------------------------------------------------------------------------------------------------------
# Exported constants: an entry each, beside the cell that defines them
# ----------------------------------------------------------------------------------------------------------------------
def _short_value(v, width: int = 90) -> str:
    "A value in a table cell: short reprs as they are, containers by their length and first keys."
    import reprlib

    if isinstance(v, dict):
        keys = ", ".join(str(k) for k in list(v)[:6]) + (", ..." if len(v) > 6 else "")
        return f"dict of {len(v)}: {keys}" if len(repr(v)) > width else repr(v)
    r = repr(v)
    if len(r) <= width:
        return r
    if isinstance(v, (tuple, list, set, frozenset)):
        return f"{type(v).__name__} of {len(v)}: " + reprlib.repr(v)[:width]
    return r[:width] + " ..."


def _comments(source: str) -> dict:
    "Line number -> comment text of a cell's source (tokenized, so a '#' inside a string is not a comment)."
    import io
    import tokenize

    out = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT and not tok.string.startswith("#|"):
                out[tok.start[0]] = tok.string.lstrip("#").strip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def constant_entries(source: str, module) -> list[dict]:
    "The exported names a cell assigns at top level (not functions or classes): name, type, value, their comment."
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    public, comments, lines = set(getattr(module, "__all__", ())), _comments(source), source.splitlines()
    rows = []
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for t in targets:
            for name in [e.id for e in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(e, ast.Name)]:
                if name not in public or not hasattr(module, name):
                    continue
                above, n = [], node.lineno - 1
                while n >= 1 and lines[n - 1].strip().startswith("#") and n in comments:
                    above.insert(0, comments[n])
                    n -= 1
                beside = [
                    comments[i] for i in range(node.lineno, (node.end_lineno or node.lineno) + 1) if i in comments
                ]
                value = getattr(module, name)
                rows.append(
                    dict(name=name, type=type(value).__name__, value=_short_value(value), doc=" ".join(above + beside))
                )
    return rows


def constants_table(module_name: str):
    "An nbdev processor: after each exported cell, a table of the constants it exports (nbdev documents only defs)."
    import importlib
    from execnb.nbio import mk_cell
    from nbdev.config import get_config
    from nbdev.processors import Processor, _want_doc

    module = importlib.import_module(f"{get_config().lib_name}.{module_name}")

    def cell_md(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    class constant_docs(Processor):
        def begin(self):
            cells = self.nb.cells
            for cell in reversed([c for c in cells if _want_doc(c)]):
                rows = constant_entries(cell.source, module)
                if not rows:
                    continue
                head = "| constant | type | value | what it is |\n|---|---|---|---|\n"
                body = "".join(
                    f'| <span id="{r["name"].lower()}" class="doc-constant">`{r["name"]}`</span> | `{r["type"]}` '
                    f"| `{cell_md(r['value']).replace('`', '')}` | {cell_md(r['doc'])} |\n"
                    for r in rows
                )
                table = mk_cell(head + body, cell_type="markdown")
                table.metadata["docs_constants"] = [r["name"] for r in rows]
                cells.insert(cell.idx_ + 1, table)

    constant_docs.__name__ = "constant_docs"
    return constant_docs


# ----------------------------------------------------------------------------------------------------------------------
# Rendering: markdown, code, outputs
# ----------------------------------------------------------------------------------------------------------------------
INLINE_TAGS = {
    "a",
    "b",
    "i",
    "em",
    "strong",
    "code",
    "sup",
    "sub",
    "br",
    "span",
    "div",
    "img",
    "details",
    "summary",
    "kbd",
    "small",
    "p",
    "table",
    "thead",
    "tbody",
    "tr",
    "td",
    "th",
    "ul",
    "ol",
    "li",
    "pre",
    "hr",
    "figure",
    "figcaption",
    "center",
    "u",
    "s",
    "del",
    "blockquote",
    "h1",
    "h2",
    "h3",
    "h4",
    "style",
}
_re_ansi = re.compile(r"\x1B(?:[@-Z\\-_]|\[[0-?]*[ -/]*[@-~])")
_re_link_attrs = re.compile(
    r"\[([^\]\n]+)\]\(([^)\s]+)\)\{([^}\n]*)\}"
)  # pandoc's [text](url){attrs}, as show_doc writes
_re_options = re.compile(r"^#\|\s*([\w-]+)\s*:\s*(.*?)\s*$")


def slug(text: str) -> str:
    "A heading's id as pandoc (and so Quarto, and nbdev's links) makes it."
    s = re.sub(r"[^\w\s.-]", "", text, flags=re.UNICODE).strip().lower()
    s = re.sub(r"\s+", "-", s)
    s = re.sub(r"^[^a-z\u00c0-\uffff]+", "", s)
    return s or "section"


_DOLLAR = "\ue024"  # a private-use character stands for `$` inside code while the equations are found


def _hide_code_dollars(text: str) -> str:
    "A `$` inside a code span or a fenced block is code, never the start or end of an equation."
    hide = lambda m: m.group(0).replace("$", _DOLLAR)  # noqa: E731
    text = re.sub(r"^(```|~~~).*?^\1", hide, text, flags=re.S | re.M)
    return re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", hide, text, flags=re.S)


def equation(latex: str, display: str, tag: str = "div") -> str:
    """A chapter's LaTeX (`$...$` inline, `$$...$$` display) as MathML, which browsers draw without a script or a
    network; an equation that does not parse fails the build, naming it."""
    from latex2mathml.converter import convert

    # operator names latex2mathml does not know, written as LaTeX writes them
    known = re.sub(r"\\(arg)(?![A-Za-z])", r"\\operatorname{\1}", latex)
    try:
        mathml = convert(known, display=display)
    except Exception as e:
        raise ValueError(f"the equation ${latex}$ does not parse: {type(e).__name__}: {e}") from e
    unknown = re.findall(r">(\\[A-Za-z]+)<", mathml)  # latex2mathml prints a command it does not know as text
    if unknown:
        raise ValueError(f"the equation ${latex}$ uses commands MathML has no rendering for: {sorted(set(unknown))}")
    return f'<{tag} class="math display">{mathml}</{tag}>\n' if display == "block" else mathml


class Renderer:
    "Markdown and cell outputs to HTML for one site (links into the site made relative, headings given ids)."

    def __init__(self, site_url: str):
        from markdown_it import MarkdownIt
        from mdit_py_plugins.dollarmath import dollarmath_plugin
        from pygments.formatters import HtmlFormatter

        self.site_url = site_url.rstrip("/") + "/"
        self.md = (
            MarkdownIt("commonmark", {"html": True, "highlight": self.highlight})
            .enable("table")
            .enable("strikethrough")
            .use(dollarmath_plugin, allow_space=False, allow_digits=False, double_inline=True)
        )
        self.md.add_render_rule("math_inline", lambda _r, tokens, i, *_: equation(tokens[i].content, "inline"))
        self.md.add_render_rule("math_block", lambda _r, tokens, i, *_: equation(tokens[i].content, "block"))
        self.md.add_render_rule("math_block_label", lambda _r, tokens, i, *_: equation(tokens[i].content, "block"))
        # `$$...$$` inside a paragraph (the sentence goes on after it) is a display equation as well
        self.md.add_render_rule(
            "math_inline_double", lambda _r, tokens, i, *_: equation(tokens[i].content, "block", tag="span")
        )
        self.formatter = HtmlFormatter(nowrap=True)

    def highlight(self, code: str, lang: str = "python", attrs=None) -> str:
        from pygments import highlight
        from pygments.lexers import TextLexer, get_lexer_by_name

        try:
            lexer = get_lexer_by_name(lang or "text")
        except Exception:
            lexer = TextLexer()
        return f'<pre class="highlight sourceCode"><code>{highlight(code, lexer, self.formatter)}</code></pre>'

    def link(self, url: str) -> str:
        "A link to the published site becomes relative, so the site works wherever it is served."
        return url[len(self.site_url) :] if url.startswith(self.site_url) else url

    def markdown(self, text: str, headings: list | None = None, ids: set | None = None) -> str:
        "Render markdown; record headings (level, id, text) in `headings`, keeping ids unique through `ids`."
        text = _re_link_attrs.sub(self._link_with_attrs, text)
        tokens = self.md.parse(_hide_code_dollars(text))
        ids = set() if ids is None else ids
        for i, tok in enumerate(tokens):
            if tok.type == "heading_open":
                inline = tokens[i + 1]
                plain = "".join(c.content for c in inline.children if c.type in ("text", "code_inline"))
                hid = base = slug(plain)
                n = 1
                while hid in ids:
                    hid, n = f"{base}-{n}", n + 1
                ids.add(hid)
                tok.attrSet("id", hid)
                if headings is not None:
                    headings.append((int(tok.tag[1]), hid, plain))
            elif tok.type == "html_block" and not self._allowed(tok.content):
                tokens[i] = self._escaped_block(tok.content)  # `<study>` in prose is text, not a tag
            for child in tok.children or []:
                if child.type == "html_inline" and not self._allowed(child.content):
                    child.type = "text"
                if child.type == "link_open":
                    child.attrSet("href", self.link(child.attrGet("href") or ""))
        return self.md.renderer.render(tokens, self.md.options, {}).replace(_DOLLAR, "$")

    @staticmethod
    def _allowed(raw: str) -> bool:
        m = re.match(r"\s*</?([A-Za-z][\w-]*)", raw)
        return raw.lstrip().startswith("<!--") or bool(m and m.group(1).lower() in INLINE_TAGS)

    def _escaped_block(self, content: str):
        from markdown_it.token import Token

        t = Token("html_block", "", 0)
        t.content = f"<p>{html.escape(content)}</p>\n"
        return t

    def _link_with_attrs(self, m) -> str:
        attrs = " ".join(f'{k}="{html.escape(v)}"' for k, v in re.findall(r'([\w-]+)="([^"]*)"', m.group(3)))
        return f'<a href="{html.escape(self.link(m.group(2)))}" {attrs}>{html.escape(m.group(1))}</a>'


def _text(v) -> str:
    return "".join(v) if isinstance(v, list) else str(v)


def inline(text: str) -> str:
    "A title or description as HTML: escaped, `code` spans kept."
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _stream_text(text: str) -> str:
    "A stream as a terminal shows it: ANSI codes dropped, a line rewritten by carriage returns shown as it ended."
    lines = [
        line.rsplit("\r", 1)[-1] if "\r" in line.rstrip("\r") else line.rstrip("\r")
        for line in _re_ansi.sub("", text).split("\n")
    ]
    return "\n".join(lines)


class Page:
    "One notebook rendered: its HTML body, headings, figures and search entries."

    def __init__(self, nb_path: Path, site: "Site"):
        import yaml

        self.nb = json.loads(nb_path.read_text())
        self.meta = self.nb["metadata"].get("docs", {})
        self.kind, self.source = self.meta.get("kind", "library"), self.meta.get("notebook", nb_path.name)
        self.name = page_name(Path(self.source))
        self.site, self.headings, self.ids, self.figures = site, [], set(), []
        front = next(
            (
                yaml.safe_load(_text(c["source"]).strip().strip("-"))
                for c in self.nb["cells"][:1]
                if c["cell_type"] == "raw"
            ),
            None,
        )
        self.front = front if isinstance(front, dict) else {}
        self.title = str(self.front.get("title") or Path(self.source).stem)
        self.description = str(self.front.get("description") or "")
        self.body = self.render()

    def render(self) -> str:
        parts = []
        for i, cell in enumerate(self.nb["cells"]):
            if cell["cell_type"] == "markdown":
                src = _text(cell["source"])
                if src.strip().startswith("<!-- WARNING: THIS FILE WAS AUTOGENERATED"):
                    continue
                cls = " doc-constants" if "docs_constants" in cell.get("metadata", {}) else ""
                parts.append(
                    f'<div class="cell markdown{cls}">{self.site.renderer.markdown(src, self.headings, self.ids)}</div>'
                )
            elif cell["cell_type"] == "code":
                parts.append(self.code_cell(i, cell))
        return "\n".join(p for p in parts if p)

    def code_cell(self, i: int, cell: dict) -> str:
        lines, options = _text(cell["source"]).splitlines(), {}
        while lines and (m := _re_options.match(lines[0])):
            options[m.group(1)] = m.group(2).strip("\"'")
            lines.pop(0)
        if options.get("include") == "false":
            return ""
        src = "\n".join(lines).strip("\n")
        out = []
        show_doc = options.get("output") == "asis"
        if src and options.get("echo") != "false":
            code = self.site.renderer.highlight(src, "python")
            if options.get("code-fold"):
                summary = html.escape(options.get("code-summary", "Code"))
                code = f'<details class="code-fold" open><summary>{summary}</summary>{code}</details>'
            out.append(f'<div class="cell-input">{code}</div>')
        not_run = cell.get("metadata", {}).get("docs_not_run")
        if not_run and src:
            why = {
                "template": "a papermill template: run it with papermill or its command",
                "eval: false": "marked eval: false",
            }.get(not_run, f"a <code>{html.escape(not_run)}</code> cell, skipped as nbdev_test skips it")
            out.append(f'<div class="not-run">Not run when this page was built ({why}).</div>')
        if options.get("output") != "false":
            for j, o in enumerate(cell.get("outputs", [])):
                out.append(self.output(i, j, o, show_doc))
        if not out:
            return ""
        cls = "cell doc-entry" if show_doc else "cell code"
        return f'<div class="{cls}">{"".join(out)}</div>'

    def output(self, i: int, j: int, o: dict, asis: bool) -> str:
        kind = o.get("output_type")
        if kind == "stream":
            text = _stream_text(_text(o.get("text", "")))
            if not text.strip():
                return ""
            return f'<pre class="cell-output {o.get("name", "stdout")}"><code>{html.escape(text)}</code></pre>'
        if kind == "error":
            trace = _re_ansi.sub("", "\n".join(o.get("traceback", [])))
            return f'<pre class="cell-output error"><code>{html.escape(trace)}</code></pre>'
        data, meta = o.get("data", {}), o.get("metadata", {})
        if "text/markdown" in data:
            body = self.site.renderer.markdown(_text(data["text/markdown"]), self.headings, self.ids)
            return body if asis else f'<div class="cell-output markdown">{body}</div>'
        if "text/html" in data:
            return f'<div class="cell-output html">{_text(data["text/html"])}</div>'
        for mime, ext in (("image/png", "png"), ("image/jpeg", "jpg")):
            if mime in data:
                name = f"{Path(self.name).stem}_files/figure-html/cell-{i + 1}-output-{j + 1}.{ext}"
                self.figures.append((name, base64.b64decode(_text(data[mime]))))
                m = meta.get(mime, {}) if isinstance(meta.get(mime), dict) else {}
                size = "".join(f' {k}="{int(m[k])}"' for k in ("width", "height") if k in m)
                return (
                    f'<div class="cell-output figure"><img src="{name}"{size} alt="figure {len(self.figures)}"></div>'
                )
        if "image/svg+xml" in data:
            return f'<div class="cell-output figure">{_text(data["image/svg+xml"])}</div>'
        if "text/plain" in data:
            return f'<pre class="cell-output plain"><code>{html.escape(_text(data["text/plain"]))}</code></pre>'
        return ""

    def search_entries(self) -> list[dict]:
        "Quarto's search.json entries: the page's text split at its h2/h3 headings."
        from html.parser import HTMLParser

        sections, current = [], dict(id="", section="", text=[])

        class Split(HTMLParser):
            def __init__(self):
                super().__init__(convert_charrefs=True)
                self.heading, self.skip = None, 0

            def handle_starttag(self, tag, attrs):
                nonlocal current
                if tag in ("h2", "h3"):
                    sections.append(current)
                    current = dict(id=dict(attrs).get("id", ""), section="", text=[])
                    self.heading = tag
                if tag in ("style", "script"):
                    self.skip += 1

            def handle_endtag(self, tag):
                if tag == self.heading:
                    self.heading = None
                if tag in ("style", "script"):
                    self.skip -= 1

            def handle_data(self, data):
                if self.skip:
                    return
                if self.heading:
                    current["section"] += data
                else:
                    current["text"].append(data)

        Split().feed(self.body)
        sections.append(current)
        out = []
        for s in sections:
            text = re.sub(r"\s+", " ", " ".join(s["text"])).strip()
            if not text and not s["section"]:
                continue
            href = f"{self.name}#{s['id']}" if s["id"] else self.name
            out.append(
                dict(
                    objectID=href,
                    href=href,
                    title=self.title,
                    section=s["section"].strip(),
                    text=text[:4000],
                    crumbs=[self.site.section_of(self)],
                )
            )
        return out


# ----------------------------------------------------------------------------------------------------------------------
# Manual pages: Quarto-style markdown (nbs/manual/*.qmd, *.md) rendered beside the notebooks
# ----------------------------------------------------------------------------------------------------------------------
MANUAL = "manual"  # the folder of nbs/ that holds the manual pages
_re_front = re.compile(r"\A---\s*\n(.*?)\n---\s*\n", re.S)
_re_md_link = re.compile(r"(!?)\[([^\]\n]*)\]\(([^)\s]+)\)")


def manual_sources(nbs: Path) -> list[Path]:
    "The manual pages' sources, in the order their front matter gives (`order:`), then by name."
    found = [p for p in (Path(nbs) / MANUAL).glob("*") if p.suffix in (".qmd", ".md")]
    return sorted(found, key=lambda p: (front_matter(p.read_text())[0].get("order", 1e9), p.name))


def front_matter(text: str) -> tuple[dict, str]:
    "A page's YAML front matter (title, description, order) and the markdown after it."
    import yaml

    m = _re_front.match(text)
    if not m:
        return {}, text
    meta = yaml.safe_load(m.group(1))
    return (meta if isinstance(meta, dict) else {}), text[m.end() :]


def manual_link(target: str, source: Path, nbs: Path) -> str | None:
    """A relative link of a manual page as the site names it: a notebook by its page (`../01a_model.ipynb` ->
    `model.html`), another manual page by its stem (`reliability.qmd` -> `reliability.html`); None when it is
    neither (it stays as written)."""
    from urllib.parse import urlsplit

    u = urlsplit(target)
    if u.scheme or u.netloc or not u.path:
        return None
    path = (source.parent / u.path).resolve()
    anchor = f"#{u.fragment}" if u.fragment else ""
    if path.suffix == ".ipynb" and path.parent == Path(nbs).resolve():
        return page_name(path) + anchor
    if path.suffix in (".qmd", ".md") and path.parent == (Path(nbs) / MANUAL).resolve():
        return f"{path.stem}.html{anchor}"
    return None


class ManualPage(Page):
    "One manual page rendered: its markdown after the front matter, its links named as the site names them."

    def __init__(self, path: Path, site: "Site", nbs: Path):
        self.front, text = front_matter(path.read_text())
        self.kind, self.source, self.name = "manual", f"{MANUAL}/{path.name}", f"{path.stem}.html"
        self.site, self.headings, self.ids, self.figures = site, [], set(), []
        self.title = str(self.front.get("title") or path.stem)
        self.description = str(self.front.get("description") or "")
        self.body = self.render_markdown(text, path, Path(nbs))

    def render_markdown(self, text: str, path: Path, nbs: Path) -> str:
        "Links rewritten to the site's names and images copied beside the page, then the markdown rendered."

        def fix(m):
            bang, label, target = m.groups()
            if bang:
                image = (path.parent / target).resolve()
                if target.startswith(("http:", "https:", "data:")) or not image.is_file():
                    return m.group(0)
                name = f"{Path(self.name).stem}_files/{image.name}"
                self.figures.append((name, image.read_bytes()))
                return f"![{label}]({name})"
            return f"[{label}]({manual_link(target, path, nbs) or target})"

        text = "\n".join(
            _re_md_link.sub(fix, part) if i % 2 == 0 else part
            for i, part in enumerate(re.split(r"(^```.*?^```)", text, flags=re.S | re.M))
        )  # links in prose only: a code block is shown as written
        return f'<div class="cell markdown">{self.site.renderer.markdown(text, self.headings, self.ids)}</div>'


def manual_pages(site: "Site", nbs: Path) -> list[ManualPage]:
    "The manual's pages of a site, in the manual's order."
    return [ManualPage(p, site, nbs) for p in manual_sources(nbs)]


class Site:
    "All pages of the site, the sidebar, the search index, and the checks."

    def __init__(self, proc_dir: Path, out_dir: Path, cfg):
        self.cfg, self.out = cfg, out_dir
        self.renderer = Renderer(cfg.doc_host + cfg.doc_baseurl)
        pages = [Page(p, self) for p in notebooks(proc_dir)]
        self.pages = pages[:1] + manual_pages(self, Path(cfg.nbs_path)) + pages[1:]  # the manual after the front page

    def section_of(self, page: Page) -> str:
        if page.kind == "index":
            return "Home"
        if page.kind == "library":
            return "Book" if in_book(Path(page.source)) else "Reference"
        return dict(library="Library", template="Papermill templates", report="Reports", manual="Manual")[page.kind]

    def sidebar(self, current: Page) -> str:
        items = []
        # the Book (the designs) right after the front page, the manual, then the machinery as reference chapters
        for title, kinds, book in (
            ("", ("index",), None),
            ("Book", ("library",), True),
            ("Manual", ("manual",), None),
            ("Reference", ("library",), False),
            ("Papermill templates", ("template",), None),
            ("Reports", ("report",), None),
        ):
            pages = [p for p in self.pages if p.kind in kinds and (book is None or in_book(Path(p.source)) == book)]
            if not pages:
                continue
            links = "".join(
                f'<li><a href="{p.name}"{" class=active aria-current=page" if p is current else ""}>'
                + ("" if p.kind == "manual" else f'<span class="nb">{html.escape(Path(p.source).stem)}</span> ')
                + f"{inline(p.title)}</a></li>"
                for p in pages
            )
            head = f'<div class="sidebar-section">{title}</div>' if title else ""
            items.append(f"{head}<ul>{links}</ul>")
        return "".join(items)

    def resolve_member_links(self) -> None:
        """nbdev links every name of its index: a method or attribute without an entry of its own
        (config.html#runconfig.run_id) is linked to its class's entry, a private helper (no entry) is not linked."""
        ids = {p.name: set(re.findall(r' id="([^"]+)"', p.body)) for p in self.pages}

        def fix(m):
            page, anchor, rest, text = m.groups()
            while page in ids and anchor not in ids[page] and "." in anchor:
                anchor = anchor.rsplit(".", 1)[0]
            if page in ids and anchor not in ids[page] and anchor.rsplit(".", 1)[-1].startswith("_"):
                return text
            return f'<a href="{page}#{anchor}"{rest}>{text}</a>'

        for p in self.pages:
            p.body = re.sub(r'<a href="([\w.-]+\.html)#([^"]+)"([^>]*)>(.*?)</a>', fix, p.body, flags=re.S)

    def write(self) -> None:
        if self.out.exists():
            shutil.rmtree(self.out)
        (self.out / "site_libs").mkdir(parents=True)
        from pygments.formatters import HtmlFormatter

        css = (ASSETS / "docs.css").read_text() + "\n" + HtmlFormatter(style="default").get_style_defs(".highlight")
        (self.out / "site_libs" / "docs.css").write_text(css)
        shutil.copy(ASSETS / "docs.js", self.out / "site_libs" / "docs.js")
        template = (ASSETS / "page.html").read_text()
        self.resolve_member_links()
        entries = []
        for page in self.pages:
            toc = "".join(
                f'<li class="toc-h{lvl}"><a href="#{hid}">{html.escape(text)}</a></li>'
                for lvl, hid, text in page.headings
                if lvl in (2, 3)
            )
            desc = f'<p class="description">{inline(page.description)}</p>' if page.description else ""
            source = f"nbs/{page.source}"
            doc = (
                template.replace("{{site_title}}", html.escape(self.cfg.title))
                .replace("{{title_html}}", inline(page.title))
                .replace("{{title}}", html.escape(page.title.replace("`", "")))
                .replace("{{description}}", desc)
                .replace("{{meta_description}}", html.escape(page.description.replace("`", "")))
                .replace("{{sidebar}}", self.sidebar(page))
                .replace(
                    "{{toc}}",
                    f'<nav class="toc"><h2 class="toc-title">On this page</h2><ul>{toc}</ul></nav>' if toc else "",
                )
                .replace("{{source}}", html.escape(source))
                .replace("{{source_url}}", html.escape(f"{self.cfg.git_url}/blob/{self.cfg.branch}/{source}"))
                .replace("{{kind}}", page.kind)
                .replace("{{body}}", page.body)
            )
            (self.out / page.name).write_text(doc)
            for name, data in page.figures:
                (self.out / name).parent.mkdir(parents=True, exist_ok=True)
                (self.out / name).write_bytes(data)
            entries += page.search_entries()
        (self.out / "search.json").write_text(json.dumps(entries, ensure_ascii=False, indent=0))
        (self.out / ".nojekyll").write_text("")
        urls = "".join(
            f"<url><loc>{html.escape(self.cfg.doc_host + self.cfg.doc_baseurl)}/{p.name}</loc></url>"
            for p in self.pages
        )
        (self.out / "sitemap.xml").write_text(
            f'<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>\n'
        )


# ----------------------------------------------------------------------------------------------------------------------
# The link check: every internal href and src resolves to a file, every #anchor to an id on its page
# ----------------------------------------------------------------------------------------------------------------------
def broken_links(site_dir: Path) -> list[str]:
    "Internal links of the site that lead nowhere, as 'page: link (why)'."
    from html.parser import HTMLParser
    from urllib.parse import unquote, urlsplit

    class Collect(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.ids, self.links = set(), []

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if a.get("id"):
                self.ids.add(a["id"])
            if tag == "a" and a.get("name"):
                self.ids.add(a["name"])
            for key in ("href", "src"):
                if a.get(key) is not None and not (tag == "a" and key == "src"):
                    self.links.append(a[key])

    pages = {}
    for f in sorted(site_dir.rglob("*.html")):
        c = Collect()
        c.feed(f.read_text())
        pages[f.resolve()] = c
    bad = []
    for f, c in pages.items():
        for link in c.links:
            u = urlsplit(link)
            if u.scheme or u.netloc or link.startswith(("mailto:", "javascript:", "data:")):
                continue
            target = (f.parent / unquote(u.path)).resolve() if u.path else f
            rel = f.relative_to(site_dir.resolve())
            if not str(target).startswith(str(site_dir.resolve())) or not target.exists():
                bad.append(f"{rel}: {link} (no such file)")
            elif u.fragment and target.suffix == ".html" and unquote(u.fragment) not in pages[target].ids:
                bad.append(f"{rel}: {link} (no such anchor)")
    return bad


# ----------------------------------------------------------------------------------------------------------------------
# The build
# ----------------------------------------------------------------------------------------------------------------------
def inputs_digest() -> str:
    "A digest of everything the site is built from: a site whose digest matches is up to date."
    import hashlib

    h = hashlib.sha256()
    files = [
        ROOT / "settings.ini",
        *sorted((ROOT / "nbs").glob("*.ipynb")),
        *sorted((ROOT / "nbs" / MANUAL).glob("*")),
        *sorted((ROOT / "depthbench_nb").rglob("*.py")),
        *sorted(ASSETS.parent.glob("docs*.py")),
        *sorted(ASSETS.rglob("*")),
        *sorted(EXAMPLE_STUDY.rglob("*")),
    ]
    for f in files:
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


EXAMPLE_FILES = (
    "params.json",
    "result.json",
    "metrics.jsonl",
    "layer_stats.jsonl",
    "diagnostics/diagnostics.json",
    "diagnostics/summary.json",
    "diagnostics/per_layer.csv",
)


def record_example(study_dir: Path) -> None:
    """Replace docs/example_study/ by the records of a finished demo study (what the reports read, with the extra runs
    of its plan; no checkpoints)."""
    study_dir = Path(study_dir)
    runs = sorted(d for d in study_dir.iterdir() if (d / "result.json").is_file())
    if not runs:
        raise SystemExit(f"[docs] no run records in {study_dir}")
    bad = [d.name for d in runs if json.loads((d / "result.json").read_text()).get("status") != "completed"]
    if bad:
        raise SystemExit(f"[docs] runs not completed in {study_dir}: {bad}")
    readme = (EXAMPLE_STUDY / "README.md").read_text() if (EXAMPLE_STUDY / "README.md").exists() else None
    if EXAMPLE_STUDY.exists():
        shutil.rmtree(EXAMPLE_STUDY)
    for d in runs:
        for name in EXAMPLE_FILES:
            if (d / name).is_file():
                (EXAMPLE_STUDY / study_dir.name / d.name / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(d / name, EXAMPLE_STUDY / study_dir.name / d.name / name)
    extras = study_dir / ".sweep" / "extra_entries.json"  # the demo's extra runs belong to the study's plan:
    if extras.is_file():  # without them the reports leave those runs out as stale
        (EXAMPLE_STUDY / study_dir.name / ".sweep").mkdir(parents=True, exist_ok=True)
        shutil.copy2(extras, EXAMPLE_STUDY / study_dir.name / ".sweep" / "extra_entries.json")
    if readme:
        (EXAMPLE_STUDY / "README.md").write_text(readme)
    size = sum(f.stat().st_size for f in EXAMPLE_STUDY.rglob("*") if f.is_file())
    print(f"[docs] {len(runs)} run records of {study_dir} -> {EXAMPLE_STUDY.relative_to(ROOT)} ({size / 1e6:.1f} MB)")


def prepare_example_runs() -> Path:
    "A fresh copy of the shipped example study's run records, for the report pages to read and write beside."
    runs = BUILD / "runs"
    if runs.exists():
        shutil.rmtree(runs)
    if not EXAMPLE_STUDY.exists():
        raise SystemExit(f"[docs] the example study is missing: {EXAMPLE_STUDY}")
    shutil.copytree(EXAMPLE_STUDY, runs, ignore=shutil.ignore_patterns("README.md"))
    return runs


def run_one(nb_path: Path, proc: Path, runs: Path, budget: float) -> dict:
    "Process one notebook in a fresh interpreter (a notebook may start processes of its own); its result as a dict."
    result = proc / f".{nb_path.stem}.result.json"
    cmd = [
        sys.executable,
        __file__,
        "--one",
        str(nb_path),
        "--proc",
        str(proc),
        "--runs",
        str(runs),
        "--budget",
        str(budget),
    ]
    start = time.time()
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget + 120)
    except subprocess.TimeoutExpired:
        return dict(
            notebook=nb_path.name, error=f"still running after {budget + 120:.0f} s", seconds=time.time() - start
        )
    if result.exists():
        out = json.loads(result.read_text())
        result.unlink()
        return out
    return dict(
        notebook=nb_path.name,
        error=f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}",
        seconds=time.time() - start,
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="notebooks processed at once")
    ap.add_argument(
        "--budget", type=float, default=600.0, help="seconds a notebook may take to run (the build fails past it)"
    )
    ap.add_argument(
        "--only",
        default="",
        help="a regular expression: process only the notebooks it matches (the site then has only those)",
    )
    ap.add_argument(
        "--record-example",
        metavar="STUDY_DIR",
        help="replace docs/example_study/ by the records of a finished "
        "demo study (e.g. papermill_runs/demo after `depthbench-nb demo`), then exit",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: process one notebook, then exit
    ap.add_argument("--proc", help=argparse.SUPPRESS)
    ap.add_argument("--runs", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.chdir(ROOT)
    if args.record_example:
        record_example(Path(args.record_example))
        return 0
    if args.one:
        r = process_notebook(Path(args.one), Path(args.proc), Path(args.runs), args.budget)
        (Path(args.proc) / f".{Path(args.one).stem}.result.json").write_text(json.dumps(r))
        return 0
    from nbdev.config import get_config

    cfg = get_config()
    nbs, out = cfg.nbs_path, cfg.doc_path
    proc = ROOT / "_proc"
    start, digest = time.time(), inputs_digest()
    import nbdev.doclinks

    nbdev.doclinks._build_modidx()  # the doc links (as nbdev_docs does first)
    runs = prepare_example_runs()
    todo = [p for p in notebooks(nbs) if re.search(args.only, p.name)]
    if proc.exists():
        shutil.rmtree(proc)
    proc.mkdir(parents=True)
    # the longest first (the reports, then the biggest notebooks), each in a fresh interpreter
    todo.sort(key=lambda p: (kind_of(p) != "report", -p.stat().st_size))
    print(
        f"[docs] processing {len(todo)} notebooks with nbdev ({args.workers} at once, every cell run but the "
        f"{cfg.get('tst_flags', '')} ones; budget {args.budget:.0f} s a notebook)",
        flush=True,
    )
    results = []
    with ThreadPoolExecutor(args.workers) as pool:
        for r in pool.map(lambda p: run_one(p, proc, runs, args.budget), todo):
            results.append(r)
            state = "FAILED" if "error" in r else f"{r['cells_run']} cells run, {r['not_run']} not run"
            print(f"[docs] {r['notebook']:32s} {r['seconds']:6.1f} s  {state}", flush=True)
    failed = [r for r in results if "error" in r]
    for r in failed:
        print(f"\n[docs] {r['notebook']} failed:\n{r['error']}", file=sys.stderr)
    over = [r for r in results if "error" not in r and r["seconds"] > args.budget]
    for r in over:
        print(
            f"[docs] {r['notebook']} took {r['seconds']:.0f} s, over the {args.budget:.0f} s budget; slowest cells "
            f"(seconds, index): {r['slowest']}",
            file=sys.stderr,
        )
    if failed or over:
        return 1
    processed = time.time() - start
    site = Site(proc, out, cfg)
    site.write()
    bad = broken_links(out)
    for b in bad:
        print(f"[docs] broken link: {b}", file=sys.stderr)
    if bad:
        return 1
    n_fig = sum(len(p.figures) for p in site.pages)
    if not args.only:  # a complete site: the tests reuse it while its inputs are unchanged
        stamp = dict(
            inputs=digest,
            seconds=round(time.time() - start, 1),
            notebooks_seconds=round(processed, 1),
            timings={r["notebook"]: round(r["seconds"], 1) for r in results},
        )
        (out / ".build.json").write_text(json.dumps(stamp, indent=1) + "\n")
    print(
        f"[docs] {len(site.pages)} pages, {n_fig} figures, search.json with "
        f"{len(json.loads((out / 'search.json').read_text()))} entries, "
        f"no broken internal link -> {out.relative_to(ROOT)}/ "
        f"(notebooks {processed:.0f} s, total {time.time() - start:.0f} s)",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
