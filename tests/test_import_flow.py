"""Imports flow one way through the package, and an import that can sit at the top of a module sits there.

Two rules, checked on every depthbench_nb/*.py (imports inside functions included):
1. a module imports only modules EARLIER in `FLOW` (never a later one, not even inside a function);
2. an import of an earlier package module sits at the top of the module, unless it pulls in a heavy library
   (`HEAVY`) that the importing module does not load already. Once rule 1 holds, an import of an earlier module
   can never close a cycle, so "needed to break a cycle" is no reason left for a function-level import.
Script entry points (`if __name__ == '__main__':`) are not imports of the module and are not checked.
Read from the source with `ast` (nothing is imported), so the test reports every violation at once."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "depthbench_nb"

# The flow, earliest first. A module may import only modules EARLIER in this list (never itself-later ones).
#   console      a leaf: output helpers (emit, ...) that import nothing from the package
#   config       dataclasses, errors, atomic writes
#   data         token data needs only the config
#   shapes -> kernels -> layers -> model -> looped
#   runs         run records and checkpoint I/O (loading a run builds its model)
#   checks       the init/invariant checks read every model family
#   costs        closed-form FLOPs, caches and memory, and measured latency: the trainer's MFU meter reads its FLOPs
#   optim        the optimisers and LR schedules of both recipes
#   run_params -> parallel -> callbacks -> launch -> trainer: a run's parameters (and its step budget and data),
#                precision / compile / processes, the loop's callbacks, the N-process launch, the loop and `train`
#   interop, hf_config, hf, hf_export, _hooks: interoperability with other code bases, after the trainer
#   diagnostics -> hf_diagnostics (the same diagnostics on any Transformers model, and the diagnose command)
#     -> lmeval (scores with the diagnostics' NLL) -> scaling (fits what the diagnostics measure)
#   slurm -> sweep -> report_common (shared report helpers) -> report_depthbench -> report_looped
#     -> report_cli (executes both report notebooks) -> demo (drives a whole study into both reports) -> cli
FLOW = [
    "console",
    "config",
    "data",
    "shapes",
    "kernels",
    "layers",
    "model",
    "looped",
    "runs",
    "checks",
    "costs",
    "optim",
    "run_params",
    "parallel",
    "callbacks",
    "launch",
    "trainer",
    "interop",
    "hf_config",
    "hf",
    "hf_export",
    "_hooks",
    "diagnostics",
    "hf_diagnostics",
    "lmeval",
    "scaling",
    "slurm",
    "sweep",
    "report_common",
    "report_depthbench",
    "report_looped",
    "report_cli",
    "demo",
    "cli",
    "__main__",
]
NOT_IN_FLOW = {"__init__", "_modidx"}  # the package root (version, hook install) and nbdev's index

# Libraries whose import costs seconds or may be missing: a function-level import of a package module is
# justified only when that module pulls in one of these that the importing module does not pull in already.
HEAVY = {
    "torch",
    "triton",
    "transformers",
    "lm_eval",
    "accelerate",
    "scipy",
    "pandas",
    "matplotlib",
    "seaborn",
    "papermill",
    "nbformat",
    "tokenizers",
    "datasets",
    "safetensors",
    "pyarrow",
    "wandb",
    "tensorboard",
    "numpy",
    "yaml",
    "tqdm",
    "jax",
}


def package_modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(), str(p)) for p in sorted(PKG.glob("*.py"))}


def _top_level_nodes(tree):
    "Import statements executed when the module is imported: module level, including inside if/try blocks."
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try, ast.With)) and not _is_main_guard(node) and not _is_type_checking(node):
            todo[:0] = [n for part in ("body", "orelse", "finalbody") for n in getattr(node, part, [])]
            todo[:0] = [n for h in getattr(node, "handlers", []) for n in h.body]


def imported(node, modules) -> tuple[list[str], list[str]]:
    "(package modules, external top-level packages) named by one import statement."
    pkg, ext = [], []
    if isinstance(node, ast.Import):
        for a in node.names:
            parts = a.name.split(".")
            if parts[0] == "depthbench_nb":
                if len(parts) > 1:
                    pkg.append(parts[1])
            else:
                ext.append(parts[0])
        return pkg, ext
    if node.level == 0 and not (node.module or "").startswith("depthbench_nb"):
        return pkg, [node.module.split(".")[0]]
    parts = (node.module or "").split(".")
    sub = parts[1] if node.level == 0 and len(parts) > 1 else (parts[0] if node.level and node.module else None)
    if sub:
        pkg.append(sub)
    else:
        # `from depthbench_nb import looped` / `from . import runs`: names that are modules; others (__version__) are
        # the root
        pkg += [a.name for a in node.names if a.name in modules]
    return pkg, ext


def _is_main_guard(node) -> bool:
    "`if __name__ == '__main__' ...:` runs the module as a script (e.g. under srun), never when it is imported."
    return isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)


def _is_type_checking(node) -> bool:
    "`if TYPE_CHECKING:` imports for annotations only, never when the module is imported."
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _import_nodes(tree):
    "Every import statement of a module, wherever it is, except in its script entry point."
    todo = [tree]
    while todo:
        node = todo.pop()
        if _is_main_guard(node):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        todo.extend(ast.iter_child_nodes(node))


def import_graph():
    "Per module: [(line, module, at_top)] of package imports, and the external packages imported at the top."
    modules = package_modules()
    edges, top_ext = {}, {}
    for name, tree in modules.items():
        top = set(map(id, _top_level_nodes(tree)))
        edges[name], top_ext[name] = [], set()
        for node in _import_nodes(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            pkg, ext = imported(node, modules)
            edges[name] += [(node.lineno, m, id(node) in top) for m in pkg]
            if id(node) in top:
                top_ext[name] |= set(ext)
    return modules, edges, top_ext


def heavy_at_import(name, edges, top_ext, seen=None) -> set[str]:
    "The heavy libraries that importing `name` loads (its own top-level imports and those of the modules it imports)."
    seen = set() if seen is None else seen
    if name in seen or name not in top_ext:
        return set()
    seen.add(name)
    out = top_ext[name] & HEAVY
    for _, m, at_top in edges[name]:
        if at_top:
            out |= heavy_at_import(m, edges, top_ext, seen)
    return out


def flow_violations() -> list[str]:
    modules, edges, top_ext = import_graph()
    rank = {m: i for i, m in enumerate(FLOW)}
    out = [
        f"depthbench_nb/{m}.py: not placed in FLOW (tests/test_import_flow.py)"
        for m in modules
        if m not in rank and m not in NOT_IN_FLOW
    ]
    for name, es in sorted(edges.items()):
        if name not in rank:
            continue
        for line, m, at_top in sorted(es):
            if m not in rank:
                continue
            where = "top" if at_top else "function"
            if rank[m] >= rank[name] and m != name:
                out.append(f"depthbench_nb/{name}.py:{line}: imports {m} ({where}), which comes later in the flow")
            elif not at_top and rank[m] < rank[name]:
                extra = heavy_at_import(m, edges, top_ext) - heavy_at_import(name, edges, top_ext)
                if not extra:
                    out.append(
                        f"depthbench_nb/{name}.py:{line}: imports {m} inside a function; it loads no heavy "
                        f"library that {name} does not load already, so the import belongs at the top"
                    )
    return out


def test_the_flow_lists_every_module_once():
    assert len(FLOW) == len(set(FLOW))
    assert not set(FLOW) & NOT_IN_FLOW


def test_the_reader_sees_every_kind_of_import():
    src = (
        "from .config import A\nfrom depthbench_nb.shapes import B\nimport depthbench_nb.model as m\n"
        "from depthbench_nb import looped as L, __version__\nfrom . import runs\nimport torch\n"
        "def f():\n    from depthbench_nb.trainer import x\n"
    )
    tree, mods = ast.parse(src), {"config", "shapes", "model", "looped", "runs", "trainer"}
    found = [imported(n, mods) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert sorted(m for pkg, _ in found for m in pkg) == sorted(mods)
    assert sum(1 for n in _top_level_nodes(tree)) == 6


def test_imports_flow_one_way():
    v = flow_violations()
    assert not v, f"{len(v)} import(s) against the flow {' -> '.join(FLOW)}:\n" + "\n".join(v)
