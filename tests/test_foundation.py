"""Foundation: configs, shapes CLI, nbdev hygiene, the wheel, and the notebook kernel."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from depthbench_nb.config import ConfigError, ModelConfig, RunConfig, _arch_names

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def run_cli(*args, check=True):
    p = subprocess.run([str(BIN / "depthbench-nb"), *args], capture_output=True, text=True, cwd=ROOT)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def test_registry_has_the_papers_designs():
    assert set(_arch_names()) >= {
        "preln",
        "periln",
        "lns",
        "deepnorm",
        "keel",
        "hc",
        "mhc",
        "attnres",
        "block_attnres",
        "moda",
        "looped",
    }
    assert "sandwich" in _arch_names(include_aliases=True)


def test_400m_grid_matches_the_paper():
    paper = {
        16: (1216, 407),
        20: (1120, 414),
        24: (1024, 405),
        28: (960, 406),
        32: (896, 399),
        42: (800, 404),
        70: (640, 409),
    }
    rows = json.loads(run_cli("shapes", "--grid", "400m", "--json").stdout)
    assert [r["n_layer"] for r in rows] == sorted(paper)
    for r in rows:
        d, total_m = paper[r["n_layer"]]
        assert r["d_model"] == d
        assert abs(r["params_total"] / (total_m * 1e6) - 1) < 0.005
        assert r["head_dim"] * 16 == r["d_model"] and r["head_dim"] % 2 == 0
    assert rows[0]["ratio"] == 76.0 and round(rows[-1]["ratio"], 1) == 9.1


def test_shapes_cli_counts_the_given_arch():
    pre = json.loads(run_cli("shapes", "--grid", "400m-main", "--arch", "preln", "--json").stdout)
    hc = json.loads(run_cli("shapes", "--grid", "400m-main", "--arch", "hc", "--json").stdout)
    for a, b in zip(
        pre, hc
    ):  # the official HC block (pretrain/OLMo-core/src/olmo_core/nn/hyper_connections.py): 6d + 26 per sublayer
        assert b["params_total"] - a["params_total"] == 2 * a["n_layer"] * (6 * a["d_model"] + 26)
    assert "n_layer" in run_cli("shapes", "--grid", "300m-backbone").stdout


@pytest.mark.parametrize(
    "args, words",
    [
        (["shapes", "--grid", "huge"], ["unknown grid", "400m", "tiny"]),
        (["shapes", "--grid", "400m", "--arch", "postln"], ["unknown architecture", "preln"]),
        (["shapes", "--grid", "400m", "--depths", "33"], ["not in grid"]),
        (["nope"], ["valid subcommands"]),
    ],
)
def test_cli_bad_input_is_a_clear_error(args, words):
    p = run_cli(*args, check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert all(w in p.stderr for w in words), p.stderr


def test_every_subcommand_has_help(capsys):
    from depthbench_nb.cli import COMMANDS, main

    for cmd in COMMANDS:  # in-process: argparse's --help exits 0 after printing the usage
        with pytest.raises(SystemExit) as e:
            main([cmd, "--help"])
        out = capsys.readouterr().out
        assert e.value.code == 0 and f"usage: depthbench-nb {cmd}" in out, (cmd, out[-500:])
    assert run_cli("--help").stdout.count("\n  ") >= len(COMMANDS)  # the console script lists them all


@pytest.mark.parametrize(
    "kw, rule",
    [
        (dict(d_model=1000, n_head=16), "divisible by n_head"),
        (dict(d_model=48, n_head=16), "head_dim"),
        (dict(n_layer=0), "n_layer must be >= 1"),
        (dict(n_head=16, n_kv_head=5), "multiple of n_kv_head"),
    ],
)
def test_impossible_shapes_name_the_rule(kw, rule):
    with pytest.raises(ConfigError, match=rule):
        ModelConfig(**kw)


def test_run_config_round_trip_and_hash():
    r = RunConfig(model=ModelConfig(arch="block_attnres", n_layer=16, d_model=1216), study="x")
    assert RunConfig.from_json(r.to_json()) == r
    assert r.run_id.startswith("block_attnres-L16-d1216-") and len(r.content_hash) == 10
    assert r.replace(model=r.model.replace(attnres_num_blocks=4)).run_id != r.run_id


def test_nbdev_clean_keeps_parameters_tag(tmp_path):
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": 3,
                "id": "abc",
                "metadata": {"tags": ["parameters"], "collapsed": True, "scrolled": True},
                "outputs": [],
                "source": ['arch = "preln"'],
            }
        ],
        "metadata": {
            "kernelspec": {"display_name": "Py", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    f = tmp_path / "p.ipynb"
    f.write_text(json.dumps(nb))
    subprocess.run([str(BIN / "nbdev_clean"), "--fname", str(f)], cwd=ROOT, check=True, capture_output=True)
    out = json.loads(f.read_text())
    cell = out["cells"][0]
    assert cell["metadata"] == {"tags": ["parameters"]}, cell["metadata"]
    assert cell["execution_count"] is None and "language_info" not in out["metadata"]
    assert out["metadata"]["kernelspec"]["name"] == "python3"


def test_committed_notebooks_use_python3_kernel_and_keep_parameters():
    for nb_path in sorted((ROOT / "nbs").glob("*.ipynb")):
        nb = json.loads(nb_path.read_text())
        assert nb["metadata"].get("kernelspec", {}).get("name") == "python3", nb_path.name
        if nb_path.name[:1] in "12":  # papermill templates and reports have exactly one parameters cell
            tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
            assert len(tagged) == 1, nb_path.name


def test_papermill_uses_the_venv_kernel_even_with_a_stray_user_kernel(tmp_path):
    # a user-level 'python3' kernelspec pointing at another interpreter must not win
    stray = tmp_path / "userdata" / "kernels" / "python3"
    stray.mkdir(parents=True)
    (stray / "kernel.json").write_text(
        json.dumps(
            {"argv": ["/usr/bin/false", "-f", "{connection_file}"], "display_name": "stray", "language": "python"}
        )
    )
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": "c1",
                "metadata": {},
                "outputs": [],
                "source": [
                    "import depthbench_nb, sys\n",
                    'print("PKG", depthbench_nb.__file__)\n',
                    'print("EXE", sys.executable)',
                ],
            }
        ],
        "metadata": {"kernelspec": {"display_name": "python3", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    src, out = tmp_path / "probe.ipynb", tmp_path / "probe.out.ipynb"
    src.write_text(json.dumps(nb))
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env["JUPYTER_DATA_DIR"] = str(tmp_path / "userdata")
    p = subprocess.run(
        [str(BIN / "papermill"), str(src), str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert p.returncode == 0, p.stderr[-2000:]
    text = "".join("".join(o.get("text", "")) for o in json.loads(out.read_text())["cells"][0]["outputs"])
    assert f"PKG {ROOT / 'depthbench_nb' / '__init__.py'}" in text, text
    assert str(ROOT / ".venv") in text.split("EXE")[1] or str(BIN) in text, text


@pytest.mark.slow
def test_wheel_builds_installs_and_ships_templates(tmp_path):
    dist = tmp_path / "dist"
    p = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    wheels = list(dist.glob("depthbench_nb-*.whl"))
    assert len(wheels) == 1
    names = zipfile.ZipFile(wheels[0]).namelist()
    templates = sorted(x.name for x in (ROOT / "nbs").glob("[12][0-9]_*.ipynb"))
    assert templates, "the checkout has no papermill templates (nbs/10-29)"
    assert sorted(n.split("/")[-1] for n in names if n.startswith("depthbench_nb/notebooks/")) == templates
    meta = zipfile.ZipFile(wheels[0]).read(next(n for n in names if n.endswith("METADATA"))).decode()
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert any(line.startswith("Requires-Dist: torch>=") for line in requires), requires
    from packaging.requirements import Requirement

    runtime = [Requirement(line.split(":", 1)[1].strip()) for line in requires if "extra ==" not in line]
    pinned = [str(r) for r in runtime if any(sp.operator in ("==", "===") for sp in r.specifier)]
    assert not pinned, pinned  # runtime deps are ranges; exact pins live in requirements-dev.txt
    triton = [r for r in runtime if r.name == "triton"]
    assert triton and "platform_machine" in str(triton[0].marker)  # Linux x86_64 only
    # a venv that sees the dev venv's packages (not the checkout's editable install) installs and imports the wheel
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    dev_site = next(Path(p) for p in sys.path if p.endswith("site-packages") and Path(p, "torch").exists())
    (site / "dev_site.pth").write_text(str(dev_site) + "\n")
    py = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheels[0])],
        check=True,
        capture_output=True,
        timeout=300,
    )
    work = tmp_path / "elsewhere"
    work.mkdir()
    code = (
        "import depthbench_nb, depthbench_nb.shapes as s, depthbench_nb.cli as c; print(depthbench_nb.__file__);"
        'print(len(s.grid_shapes("400m"))); c.main(["notebooks", "nbs_out"])'
    )
    r = subprocess.run([str(py), "-c", code], cwd=work, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert str(site) in r.stdout.splitlines()[0] and r.stdout.splitlines()[1] == "7"
    assert sorted(x.name for x in (work / "nbs_out").glob("*.ipynb")) == templates
    # the startup hook ships at the wheel's root: a fresh interpreter of that venv watches for Transformers and lm-eval
    assert "depthbench_nb-hooks.pth" in names and (site / "depthbench_nb-hooks.pth").is_file()
    r = subprocess.run(
        [str(py), "-c", 'import sys; print("depthbench_nb._hooks" in sys.modules)'],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.stdout.strip() == "True", r.stderr[-2000:]


# every subcommand group and its subcommands (the usage line of the group lists them)
SUBCOMMAND_GROUPS = {
    "data": ("prepare", "inspect", "verify"),
    "sweep": ("plan", "run", "status"),
    "slurm": ("info", "node-launch"),
}


def test_every_subcommand_answers_help(capsys):
    "`depthbench-nb CMD [SUB] --help` prints the usage and exits 0, for every subcommand."
    from depthbench_nb.cli import COMMANDS, main

    for cmd in COMMANDS:
        for argv in [[cmd]] + [[cmd, sub] for sub in SUBCOMMAND_GROUPS.get(cmd, ())]:
            try:
                rc = main(argv + ["--help"])
            except SystemExit as e:
                rc = e.code
            out, err = capsys.readouterr()
            if rc == 2 and "pip install" in err:
                continue  # an optional dependency this install lacks
            assert rc == 0 and out.startswith("usage: depthbench-nb " + " ".join(argv)), (argv, rc, err)
            if cmd in SUBCOMMAND_GROUPS and len(argv) == 1:
                assert "{" + ",".join(SUBCOMMAND_GROUPS[cmd]) + "}" in out
            if cmd != "train":
                assert (
                    "--json" in out or argv == ["slurm", "node-launch"] or len(argv) == 1 and cmd in SUBCOMMAND_GROUPS
                )


def test_parsers_are_generated_not_hand_written():
    """Options are written once, in a command function's signature (or a dataclass): only the console module builds
    argparse parsers; the train parser, generated from RunParams, is the one other."""
    import re
    import depthbench_nb

    pkg = Path(depthbench_nb.__file__).parent
    hand_written = {
        f.name: len(re.findall(r"ArgumentParser\(|\.add_argument\(|\.add_subparsers\(", f.read_text()))
        for f in sorted(pkg.glob("*.py"))
        if f.name != "console.py"
    }
    trainer = (pkg / "trainer.py").read_text()
    assert "add_dataclass_options(p, RunParams)" in trainer
    hand_written.pop("trainer.py")
    assert not {k: v for k, v in hand_written.items() if v}, hand_written


def _owned_comments(fn) -> tuple[dict, set]:
    """(parameter -> the comments written on its own lines: each line of its annotation and default, and the block
    of whole-line comments right above it; every comment of the signature), read with ast and tokenize."""
    import ast
    import inspect
    import io
    import textwrap
    import tokenize

    source = textwrap.dedent(inspect.getsource(fn))
    toks = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    text = {t.start[0]: t.string.lstrip("#").strip() for t in toks}
    alone = {t.start[0] for t in toks if t.line.strip().startswith("#")}
    node = ast.parse(source).body[0]
    args = node.args
    nodes = args.posonlyargs + args.args + args.kwonlyargs
    defaults = [None] * (len(args.posonlyargs + args.args) - len(args.defaults)) + args.defaults + args.kw_defaults
    body = max([p.end_lineno for p in nodes] + [d.end_lineno for d in defaults if d is not None])  # the parameters
    text = {n: c for n, c in text.items() if n <= body}
    owned = {}
    for p, d in zip(nodes, defaults):
        last = max(p.end_lineno, d.end_lineno if d is not None else 0)
        mine = {text[n] for n in range(p.lineno, last + 1) if n in text}
        block, n = [], p.lineno - 1
        while n in alone:
            block, n = [text[n]] + block, n - 1
        owned[p.arg] = mine | ({" ".join(block)} if block else set())
    everything = set(text.values())
    blocks, run = set(), []
    for n in range(1, body + 1):  # whole-line comment blocks joined, as a help may span lines
        if n in alone:
            run.append(text[n])
        elif run:
            blocks.add(" ".join(run))
            run = []
    return owned, everything | blocks


def test_every_generated_option_help_belongs_to_its_option(monkeypatch, capsys):
    """For every subcommand whose parser is generated from a signature (parser_from_signature: the help from the
    comment after each parameter), each option's --help text is a comment written on that parameter's own lines,
    never a neighbour's (a wrapped parameter once showed the comment of the parameter above it)."""
    import argparse

    from depthbench_nb import console
    from depthbench_nb.cli import COMMANDS, main

    seen, original = [], console.parser_from_signature

    def recording(fn, *a, **kw):
        p = original(fn, *a, **kw)
        seen.append((fn, p))
        return p

    monkeypatch.setattr(console, "parser_from_signature", recording)
    for cmd in COMMANDS:
        for argv in [[cmd]] + [[cmd, sub] for sub in SUBCOMMAND_GROUPS.get(cmd, ())]:
            try:
                main(argv + ["--help"])
            except SystemExit:
                pass
            capsys.readouterr()
    checked = set()
    for fn, parser in seen:
        owned, comments = _owned_comments(fn)
        for action in parser._actions:
            if not action.option_strings or action.dest not in owned or isinstance(action, argparse._HelpAction):
                continue
            if action.help in comments:  # a help from a comment: the parameter's own
                assert action.help in owned[action.dest], (fn.__name__, action.option_strings, action.help)
                checked.add((fn.__name__, action.dest))
            else:  # written elsewhere (an Arg(help=...) or the standard --json text), never a comment of the source
                assert not any(action.help and action.help in owned[o] for o in owned), (fn.__name__, action.dest)
    assert len({name for name, _ in checked}) >= 10 and ("_diagnose_command", "eval_limit") in checked
    help_of = {a.dest: a.help for fn, p in seen if fn.__name__ == "_diagnose_command" for a in p._actions}
    assert help_of["eval_limit"].startswith("pairs per evaluation set") and help_of["device"].startswith("cpu | cuda")
