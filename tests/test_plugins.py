"""Designs as plugins: the worked example `examples/denseformer_plugin` is pip-installed into a private folder (never
into the environment) and, in fresh processes that find it only through PYTHONPATH, trains through
`depthbench-nb train --arch denseformer`, passes the shared check suite, and is seen by shapes, costs, sweeps and the
HF export, with no edit of depthbench-nb. A plugin that fails to load is named, and the other designs stay usable."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "examples" / "denseformer_plugin"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    "The example plugin installed with pip into a private folder (a copy is built: the checkout stays clean)."
    tmp = tmp_path_factory.mktemp("plugin")
    shutil.copytree(PLUGIN, tmp / "src", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    site = tmp / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "--quiet"]
    subprocess.run(cmd + ["--target", str(site), str(tmp / "src")], check=True, capture_output=True, timeout=600)
    return site


def _env(*paths: Path, runs: Path) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, [*paths, ROOT])), DEPTHBENCH_RUNS=str(runs))


def _cli() -> list[str]:
    "The installed `depthbench-nb` command (the package's console script), else the same entry point through Python."
    script = Path(sys.executable).with_name("depthbench-nb")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from depthbench_nb.cli import main; sys.exit(main())"]


def _python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)


def _train_denseformer(env: dict, tiny_data) -> dict:
    "`depthbench-nb train --arch denseformer --dwa-dilation 2` on the tiny data, two steps: its JSON result."
    args = ["train", "--arch", "denseformer", "--dwa-dilation", "2", "--L", "2", "--d-model", "32"]
    args += ["--preset", "tiny", "--max-steps", "2", "--data", str(tiny_data), "--json", "--no-progress"]
    done = subprocess.run(_cli() + args, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_plugin_trains_through_the_cli(plugin_site, tiny_data, tmp_path):
    "depthbench-nb train --arch denseformer with its option: exit 0, a completed run record holding the option."
    env = _env(plugin_site, runs=tmp_path / "runs")
    out = _train_denseformer(env, tiny_data)
    assert out["status"] == "completed" and out["arch"] == "denseformer" and out["steps"] == 2
    assert out["params_total"] == out["params_closed_form"]
    folder = tmp_path / "runs" / out["study"] / out["run_id"]
    params = json.loads((folder / "params.json").read_text())
    assert params["model"]["arch"] == "denseformer" and params["model"]["dwa_dilation"] == 2
    assert json.loads((folder / "result.json").read_text())["status"] == "completed"


SEEN_BY_EVERYTHING = r"""
import contextlib
import tempfile
from pathlib import Path

import torch
from depthbench_nb.checks import assert_design_ok, _tiny_config
from depthbench_nb.config import ModelConfig, _arch_names, paper_designs, DESIGN_OPTIONS
from depthbench_nb.costs import cost_row
from depthbench_nb.model import build_model, n_params
from depthbench_nb.shapes import count_params
from depthbench_nb.sweep import expand_study, load_study
from depthbench_nb.trainer import train_parser

assert "denseformer" in _arch_names() and "denseformer" not in paper_designs(), _arch_names()
for k in (1, 2, 3):  # the shared check suite, with its option
    assert_design_ok(_tiny_config("denseformer", dwa_dilation=k))
cfg = _tiny_config("denseformer")
assert cfg.dwa_dilation == 1 and "dwa_dilation" in DESIGN_OPTIONS
extra = sum((b + 1) // 2 + 1 for b in range(cfg.n_layer))  # dilation 2: positions b+1, b-1, ... >= 0
assert count_params(cfg.replace(dwa_dilation=2)).total == count_params(_tiny_config("preln")).total + extra
assert n_params(build_model(cfg)) == count_params(cfg).total
row = cost_row(cfg.replace(n_layer=8, d_model=64, n_head=4), seq_len=128, train_seq_len=128)
assert row["arch"] == "denseformer", row
x = torch.randint(0, cfg.vocab_size, (2, 8))
assert torch.equal(build_model(cfg)(x), build_model(_tiny_config("preln"))(x))  # its init is Pre-LN
assert "--dwa-dilation" in train_parser().format_help()
# sweeps: a study file names the plugin design and its option like any built-in one
study = Path(tempfile.mkdtemp()) / "plug.yaml"
study.write_text(
    "name: plug\npreset: tiny\ngroups:\n  - name: dwa\n    archs: [denseformer]\n    depths: [2, 4]\n"
    "    max_steps: 2\n    option_sets: [{dwa_dilation: 2}]\n"
)
with contextlib.redirect_stdout(None):
    entries = expand_study(load_study(study))
assert [e.run.model.dwa_dilation for e in entries] == [2, 2] and "dwa_dilation=2" in entries[0].label()
assert entries[0].run_id.startswith("denseformer-L2-")
for bad in (dict(arch="preln", dwa_dilation=2), dict(arch="denseformer", dwa_dilation=0)):
    try:
        ModelConfig(**bad)
    except Exception as e:
        print(type(e).__name__, e)
    else:
        raise AssertionError(f"accepted {bad}")
print("ok")
"""


def test_plugin_is_seen_by_checks_shapes_costs_sweeps(plugin_site, tmp_path):
    done = _python(SEEN_BY_EVERYTHING, _env(plugin_site, runs=tmp_path / "runs"))
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
    assert "does not apply to arch 'preln' (it applies to: denseformer)" in done.stdout
    assert "dwa_dilation must be a positive integer" in done.stdout


def test_plugin_in_shapes_costs_and_sweep_commands(plugin_site, tmp_path):
    env = _env(plugin_site, runs=tmp_path / "runs")
    for args in (["shapes", "--grid", "tiny", "--arch", "denseformer"], ["costs", "--grid", "tiny", "--arch", "all"]):
        done = subprocess.run(_cli() + args + ["--json"], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "denseformer" in done.stdout


def test_a_broken_plugin_is_named(tmp_path):
    "An entry point that cannot load: a warning and every lookup of its name say which plugin and why."
    info = tmp_path / "site" / "broken_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[depthbench_nb.designs]\nbroken = no_such_module_here:design\n")
    code = (
        "from depthbench_nb.config import ConfigError, resolve_arch\n"
        "assert resolve_arch('preln').name == 'preln'\n"
        "try:\n    resolve_arch('broken')\nexcept ConfigError as e:\n    print(e)\n"
    )
    done = _python(code, _env(tmp_path / "site", runs=tmp_path / "runs"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "design plugin 'broken'" in done.stdout and "no_such_module_here" in done.stdout, done.stdout
    assert "broken-plugin" in done.stdout and "design plugin 'broken'" in done.stderr  # the package; the warning


LOAD_EXPORT = r"""
import json
import sys

import torch
import depthbench_nb  # registers the model type 'depthbench'; the plugin's design comes from its entry point
from transformers import AutoModelForCausalLM
from depthbench_nb.runs import load_run

run_dir, out = sys.argv[1:3]
plugin = json.load(open(f"{out}/config.json"))["design_plugin"]
assert plugin["distribution"] == "depthbench-denseformer" and plugin["version"] == "0.1.0", plugin
assert plugin["module"] == "depthbench_denseformer", plugin
model = AutoModelForCausalLM.from_pretrained(out)
ours, run = load_run(run_dir)
assert run.model.dwa_dilation == 2 and model.config.model_config() == run.model
assert any(c.__module__ == "depthbench_denseformer" for m in model.model.modules() for c in type(m).__mro__)
ids = torch.randint(0, run.model.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
remote = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)  # its remote code uses the plugin
with torch.no_grad():
    assert torch.equal(model(ids).logits, ours(ids)) and torch.equal(remote(ids).logits, ours(ids))
print("ok")
"""


def test_plugin_design_exports_to_hf(plugin_site, tiny_data, tmp_path):
    """export-hf of a plugin design's run: the config names the plugin (distribution, version), the export loads with
    AutoModelForCausalLM where the plugin is installed, with the run's logits; without the plugin,
    trust_remote_code=True stops with a one-line error naming what to pip install."""
    env = _env(plugin_site, runs=tmp_path / "runs")
    res = _train_denseformer(env, tiny_data)
    run_dir, out = tmp_path / "runs" / res["study"] / res["run_id"], tmp_path / "export"
    done = subprocess.run(
        _cli() + ["export-hf", str(run_dir), str(out), "--json"], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    files = set(json.loads(done.stdout)["files"])
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", "configuration_depthbench.py"} <= files
    assert "pip install 'depthbench-denseformer==0.1.0'" in (out / "README.md").read_text()
    done = subprocess.run(
        [sys.executable, "-c", LOAD_EXPORT, str(run_dir), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
    # no plugin on the path, with depthbench-nb and without it (remote code): a one-line error naming the plugin
    code = "from transformers import AutoModelForCausalLM\n"
    code += f"AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)"
    bare = f"import sys\nsys.path.append({sysconfig.get_paths()['purelib']!r})  # no .pth files: no depthbench_nb\n"
    for argv, extra in (([sys.executable, "-c", code], ROOT), ([sys.executable, "-S", "-c", bare + code], None)):
        env = dict(os.environ, PYTHONPATH=str(extra or ""), HF_MODULES_CACHE=str(tmp_path / "modules"))
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        last = done.stderr.strip().splitlines()[-1]
        assert (
            done.returncode != 0
            and "Error: design 'denseformer' comes from the plugin depthbench-denseformer 0.1.0" in last
        ), done.stderr[-3000:]
        assert "pip install 'depthbench-denseformer==0.1.0'" in last, last
    assert "ImportError: design 'denseformer'" in last  # the second: the remote code's own error
