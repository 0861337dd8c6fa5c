"""The fault suite, inputs: nothing unbounded, a number is a number, the exit status tells the truth.

Every case is an input someone could hand the command line (a `--set` value, a seed, a study file, a callback module,
a model folder, a deeply nested JSON file) that used to end in a traceback, a silent wrong value, a run that never
ends or an exit 0 without a result. Each now ends in one line and its exit code (2: refused before anything is
built; 3: interrupted, with a checkpoint), fast. Most run in this process through the command line's `main`; the
ones whose old behaviour was to run for minutes or to exhaust memory run in a child with a time limit."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import yaml

from depthbench_nb.cli import main
from depthbench_nb.runs import list_checkpoints, read_result

pytestmark = pytest.mark.faults

CLI = [sys.executable, "-c", "import sys; from depthbench_nb.cli import main; sys.exit(main())"]
TINY = ["--arch", "preln", "--L", "2", "--d-model", "32", "--preset", "tiny", "--no-progress"]


# ------------------------------------------------------------------------------------------------------ helpers
def ledger(faults: int = 0, runs: int = 0, survived: int = 0, lost: int = 0) -> None:
    "Add to the session's fault summary (conftest.py prints it)."
    path = os.environ.get("DEPTHBENCH_FAULT_LEDGER")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(dict(faults=faults, runs=runs, survived=survived, lost=lost)) + "\n")


def refused(capsys, argv: list[str], as_json: bool = True, kinds=("config",)) -> str:
    """`depthbench-nb ARGV` in this process: exit 2 and one error line (a JSON {error, kind} with --json), no
    traceback; returns the message."""
    capsys.readouterr()
    rc = main(argv + (["--json"] if as_json else []))
    out, err = capsys.readouterr()
    assert rc == 2 and "Traceback" not in err, (rc, out[-1500:], err[-3000:])
    if as_json:
        obj = json.loads(out.strip().splitlines()[-1])
        assert set(obj) == {"error", "kind"} and obj["kind"] in kinds, obj
        return obj["error"]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"depthbench-nb {argv[0]}: error: "), err[-2000:]
    return last


def no_run_folder(runs_dir: Path) -> None:
    assert not runs_dir.exists() or not [p for p in runs_dir.rglob("*") if p.is_dir()], list(runs_dir.rglob("*"))


def module(folder: Path, text: str) -> str:
    "A module of a fresh name in `folder` (a folder on sys.path): its name."
    name = f"cb_{uuid.uuid4().hex[:10]}"
    (folder / f"{name}.py").write_text(textwrap.dedent(text))
    return name


@pytest.fixture
def cb_dir(tmp_path, monkeypatch):
    "A folder on sys.path (as an installed package's would be) for callback modules."
    d = tmp_path / "site"
    d.mkdir()
    monkeypatch.syspath_prepend(str(d))
    return d


# ============================================================================ 1. every float option is a finite number
# (name, value): values the config's rules accepted, or that crashed deep inside the optimizer
FLOATS = [
    ("train.weight_decay", ".nan"),
    ("train.weight_decay", ".inf"),
    ("train.eps", ".nan"),
    ("train.eps", ".inf"),
    ("train.eps", "-.inf"),
    ("train.eps", "-1"),
    ("train.eps", "0"),
    ("train.grad_clip", ".nan"),
    ("train.grad_clip", ".inf"),
    ("train.tokens_per_param", ".nan"),
    ("train.tokens_per_param", ".inf"),
    ("train.tokens_per_param", "-.inf"),
    ("train.tokens_per_param", "-5"),
    ("train.tokens_per_param", "0"),
    ("train.divergence_factor", ".nan"),
    ("train.divergence_factor", ".inf"),
    ("model.rope_theta", ".inf"),
    ("model.norm_eps", ".inf"),
    ("model.init_std", ".inf"),
]


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "plain"])
@pytest.mark.parametrize("name,value", FLOATS, ids=[f"{n}={v}" for n, v in FLOATS])
def test_a_float_option_is_finite_and_in_its_range(name, value, as_json, tiny_data, runs_dir, capsys):
    """`--set NAME=VALUE` with NaN, an infinity or a value outside the rule: exit 2, one line naming the option,
    before any run folder is made (NaN switched the divergence guard off and broke resume; weight_decay NaN gave
    `diverged` with exit 0; eps -1 was a traceback from the optimizer)."""
    said = refused(
        capsys, ["train", *TINY, "--max-steps", "2", "--data", str(tiny_data), "--set", f"{name}={value}"], as_json
    )
    assert name.split(".")[1] in said, said
    no_run_folder(runs_dir)
    ledger(faults=1)


def test_a_budget_of_nan_tokens_per_param_is_one_line(tiny_data, runs_dir, capsys):
    "`train.max_steps=null` with `tokens_per_param=.nan`: the budget is not a number; one line (was a traceback)."
    argv = ["train", *TINY, "--data", str(tiny_data), "--set", "train.max_steps=null"]
    said = refused(capsys, argv + ["--set", "train.tokens_per_param=.nan"])
    assert "tokens_per_param" in said and "NaN" in said, said
    no_run_folder(runs_dir)
    ledger(faults=1)


LOOPED_FLOATS = [("--set", "model.logit_softcap=.inf"), ("--C", "nan"), ("--C", "inf")]


@pytest.mark.parametrize("flag,value", LOOPED_FLOATS, ids=[f"{f}={v}" for f, v in LOOPED_FLOATS])
def test_a_looped_float_is_finite(flag, value, tiny_data, runs_dir, capsys):
    "A design option (the looped softcap) and the looped FLOP budget `--C` are finite numbers too."
    argv = ["train", "--arch", "looped", "--preset", "tiny", "--max-steps", "1", "--no-progress"]
    said = refused(capsys, argv + ["--data", str(tiny_data), flag, value])
    assert "NaN" in said or "nan" in said or "inf" in said, said
    no_run_folder(runs_dir)
    ledger(faults=1)


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_the_divergence_factor_flag_is_finite(value, tiny_data, runs_dir, capsys):
    said = refused(capsys, ["train", *TINY, "--max-steps", "1", "--data", str(tiny_data), "--divergence-factor", value])
    assert "divergence_factor" in said, said
    no_run_folder(runs_dir)
    ledger(faults=1)


# ====================================================================== 2. integers fit their dtype, seeds are seeds
SEEDS = [-1, -(2**63), 2**63, 2**64, 2**64 + 1, 10**30]


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "plain"])
@pytest.mark.parametrize("seed", SEEDS, ids=[str(s) for s in SEEDS])
def test_a_seed_outside_64_bits_or_negative_is_refused_before_training(seed, as_json, tiny_data, runs_dir, capsys):
    "`--seed -1` failed mid-run (numpy), a seed above 2^64 overflowed in torch: both are one line before the run."
    said = refused(capsys, ["train", *TINY, "--max-steps", "1", "--data", str(tiny_data), "--seed", str(seed)], as_json)
    assert "seed" in said, said
    no_run_folder(runs_dir)
    ledger(faults=1)


INTS = [
    ("train.init_seed", -1),
    ("train.init_seed", 2**64),
    ("train.seed", 2**63),
    ("train.keep_checkpoints", 2**63),
    ("train.checkpoint_every", 2**64),
    ("train.layer_stats_every", 2**70),
    ("model.vocab_size", 2**63),
    ("model.n_layer", 10**20),
]


@pytest.mark.parametrize("name,value", INTS, ids=[f"{n}={v}" for n, v in INTS])
def test_an_integer_option_fits_64_bits(name, value, tiny_data, runs_dir, capsys):
    said = refused(capsys, ["train", *TINY, "--max-steps", "1", "--data", str(tiny_data), "--set", f"{name}={value}"])
    assert name.split(".")[1] in said, said
    no_run_folder(runs_dir)
    ledger(faults=1)


# ============================================================================= 3. studies: bounded before anything
def study_file(folder: Path, name: str = "s", **group) -> Path:
    group = dict(dict(name="g", archs=["preln"], depths=[2], max_steps=1), **group)
    p = folder / f"{uuid.uuid4().hex[:8]}.yaml"
    p.write_text(yaml.safe_dump(dict(name=name, preset="tiny", groups=[group])))  # NaN as .nan, as a user writes it
    return p


STUDY_NUMBERS = {
    "C-nan": dict(archs=[], depths=[], r=[1], s=[1], C=[float("nan")]),
    "C-inf": dict(archs=[], depths=[], r=[1], s=[1], C=[float("inf")]),
    "param_data_ratio-inf": dict(archs=[], depths=[], r=[1], s=[1], max_steps=None, param_data_ratio=float("inf")),
    "seed-negative": dict(seeds=[-1]),
    "seed-2^64": dict(seeds=[2**64]),
    "set-nan": dict(set={"train.weight_decay": [0.1, float("nan")]}),
}


NON_FINITE = ("C-nan", "C-inf", "param_data_ratio-inf", "set-nan")


@pytest.mark.parametrize("case", STUDY_NUMBERS)
def test_a_study_number_is_a_number(case, tmp_path, runs_dir, capsys):
    "NaN, infinity, a negative or 65-bit seed in a study file: `sweep plan` refuses in one line (exit 2)."
    said = refused(capsys, ["sweep", "plan", str(study_file(tmp_path, **STUDY_NUMBERS[case]))])
    assert ("NaN and infinity" if case in NON_FINITE else "seed") in said, said
    ledger(faults=1)


def _values(n: int, start: float = 1e-4) -> list[float]:
    return [start * (1 + i / n) for i in range(n)]


CAPS = {  # case: (group, runs it plans)
    "set-5x100": (
        dict(set={f"train.{k}": _values(100) for k in ("lr", "weight_decay", "eps", "warmup_frac", "final_lr_frac")}),
        10**10,
    ),
    "lrs-1000-x-seeds-1000": (dict(lrs=_values(1000), seeds=list(range(1000))), 10**6),
    "set-10^5": (dict(set={"train.lr": _values(100), "train.seed": list(range(1000))}), 10**5),
    "seeds-5001": (dict(seeds=list(range(5001))), 5001),
    "looped-r-s-C": (dict(archs=[], depths=[], r=list(range(1, 51)), s=list(range(1, 11)), C=_values(20, 1e15)), 10**4),
}


@pytest.mark.parametrize("case", CAPS)
def test_a_study_of_too_many_runs_is_refused_within_seconds_naming_the_count(case, tmp_path, runs_dir):
    """The run count is the product of the lists' lengths, refused above the cap before any run (or any list of
    them) is built: exit 2 within seconds, naming the count (5 x 100 values built a 10^10-element list; 10^5 runs were
    still planning at 90 s). A child process, 4 GiB of address space, 90 s at most (the old behaviour)."""
    import resource

    group, runs = CAPS[case]
    p = study_file(tmp_path, **group)

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, resource.getrlimit(resource.RLIMIT_AS)[1]))

    t0 = time.time()
    try:
        proc = subprocess.run(
            CLI + ["sweep", "plan", str(p), "--json"], capture_output=True, text=True, timeout=90, preexec_fn=cap
        )
    except subprocess.TimeoutExpired:
        pytest.fail("sweep plan was still planning after 90 s")
    took = time.time() - t0
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])
    obj = json.loads(proc.stdout)
    assert obj["kind"] == "config" and f"{runs:,} runs" in obj["error"] and "5,000" in obj["error"], obj
    assert took < 60 and "Traceback" not in proc.stderr, (took, proc.stderr[-2000:])
    ledger(faults=1)


def test_a_plan_json_of_another_study_is_not_read(tmp_path, runs_dir, capsys):
    """`.sweep/plan.json` of study `victim` claiming to be study `other` (and naming a study file called `victim`):
    its file is not taken as victim's plan (nothing checked the plan's study)."""
    from depthbench_nb.sweep import current_plan

    planted = study_file(tmp_path, name="victim")
    sweep = runs_dir / "victim" / ".sweep"
    sweep.mkdir(parents=True)
    (sweep / "plan.json").write_text(json.dumps(dict(study="other", file=str(planted), run_ids=[])))
    assert current_plan("victim") is None
    ledger(faults=1)


def test_a_planted_plan_of_a_huge_study_is_refused_in_seconds(tmp_path, runs_dir, capsys):
    """plan.json naming a study file of 10^6 runs: the report's run table (`report`) refuses that plan in seconds,
    naming the count, and reads the run folders instead (it planned the whole study). At most 60 s (the old
    behaviour), by an alarm."""
    from depthbench_nb.report_common import study_table

    group, runs = CAPS["lrs-1000-x-seeds-1000"]
    planted = study_file(tmp_path, name="victim", **group)
    sweep = runs_dir / "victim" / ".sweep"
    sweep.mkdir(parents=True)
    (sweep / "plan.json").write_text(json.dumps(dict(study="victim", file=str(planted), run_ids=[])))

    def late(signum, frame):
        raise TimeoutError("still planning after 60 s")

    previous = signal.signal(signal.SIGALRM, late)
    signal.alarm(60)
    try:
        capsys.readouterr()
        assert len(study_table("victim")) == 0
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    out, _ = capsys.readouterr()
    assert f"{runs:,} runs" in out, out[-2000:]
    ledger(faults=1)


@pytest.mark.parametrize("where", ["study file", "train --study"])
def test_a_300_character_study_name_says_it_is_too_long(where, tmp_path, tiny_data, runs_dir, capsys):
    "A study name longer than a folder name: the reason and the limit (it said `.sweep is not writable`)."
    name = "s" * 300
    if where == "study file":
        said = refused(capsys, ["sweep", "plan", str(study_file(tmp_path, name=name))])
    else:
        said = refused(capsys, ["train", *TINY, "--max-steps", "1", "--data", str(tiny_data), "--study", name])
    assert "300 bytes" in said and "255" in said, said
    ledger(faults=1)


def test_an_unknown_study_lists_the_valid_studies(capsys):
    said = refused(capsys, ["sweep", "plan", "no-such-study"])
    assert "valid studies:" in said and "studys" not in said, said


# ======================================================================================== 4. callbacks: where from
BAD_SPECS = [".foo:X", "..foo:X", "foo..bar:X", "foo:1X", "foo-bar:X", "foo/bar:X", "foo:X.Y"]


@pytest.mark.parametrize("spec", BAD_SPECS)
def test_a_malformed_callback_spec_is_one_line(spec, tiny_data, runs_dir, capsys):
    "`--callback '.foo:X'` was a TypeError traceback (a relative import): every malformed spec is one line."
    said = refused(capsys, ["train", *TINY, "--max-steps", "1", "--data", str(tiny_data), "--callback", spec])
    assert "callback" in said and "package.module:Name" in said, said
    no_run_folder(runs_dir)
    ledger(faults=1)


AT_IMPORT = {
    "SyntaxError": ("def broken(:\n", "SyntaxError"),
    "raises": ("raise RuntimeError('boom at import')\n", "boom at import"),
    "sys.exit(0)": ("import sys\nsys.exit(0)\n", "sys.exit(0)"),
    "sys.exit(3)": ("import sys\nsys.exit(3)\n", "sys.exit(3)"),
}


@pytest.mark.parametrize("case", AT_IMPORT)
def test_a_callback_module_failing_at_import_is_one_line_and_no_run(case, cb_dir, tiny_data, runs_dir, capsys):
    """A callback module with a SyntaxError, raising, or calling sys.exit while imported: exit 2, one line (sys.exit(0)
    ended `train` with exit 0 and no run)."""
    text, says = AT_IMPORT[case]
    name = module(cb_dir, text)
    said = refused(capsys, ["train", *TINY, "--max-steps", "1", "--data", str(tiny_data), "--callback", f"{name}:X"])
    assert name in said and says in said, said
    no_run_folder(runs_dir)
    ledger(faults=1)


def test_a_module_in_the_working_directory_is_never_imported(tmp_path, tiny_data, runs_dir, capsys, monkeypatch):
    "A callback module planted in the working directory (first on sys.path under `python -m`) does not run."
    work = tmp_path / "work"
    work.mkdir()
    marker = tmp_path / "ran"
    name = module(work, f"open({str(marker)!r}, 'w').write('x')\nfrom depthbench_nb.callbacks import Callback as Cb\n")
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(work))  # what `python -m` does with the working directory
    said = refused(capsys, ["train", *TINY, "--max-steps", "1", "--data", str(tiny_data), "--callback", f"{name}:Cb"])
    assert "cannot import" in said and not marker.exists(), said
    ledger(faults=1)


def test_a_callback_file_given_on_the_command_line_is_used(tmp_path, tiny_data, runs_dir, capsys):
    "`--callback path/to/file.py:Name`: the file the user named is imported (and only that file)."
    f = tmp_path / "mycb.py"
    f.write_text(
        "from depthbench_nb.callbacks import Callback\n"
        "class Tag(Callback):\n"
        "    def on_before_optimizer_step(self, state):\n"
        "        state.row['tagged'] = 1.0\n"
    )
    capsys.readouterr()
    assert main(["train", *TINY, "--max-steps", "1", "--data", str(tiny_data), "--callback", f"{f}:Tag", "--json"]) == 0
    (folder,) = (runs_dir / "default").glob("preln-*")
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["tagged"] for r in rows if "step" in r] == [1.0]
    ledger(runs=1, survived=1)


STUDY_CALLBACKS = {
    "string": ('depthbench_nb.callbacks:StopAfter={"n": 1}', None),
    "file": ("{tmp}/cb.py:X", "modules of installed packages"),
    "file-in-a-list": (["{tmp}/cb.py:X"], "modules of installed packages"),
    "number": (3, "callback"),
}


@pytest.mark.parametrize("case", STUDY_CALLBACKS)
def test_a_study_names_installed_callbacks(case, tmp_path, runs_dir, capsys):
    """A study's `callbacks:` given as one string is one callback (it was split into characters); a file or a relative
    name is refused: a study names modules of installed packages."""
    spec, says = STUDY_CALLBACKS[case]
    spec = json.loads(json.dumps(spec).replace("{tmp}", str(tmp_path)))
    p = study_file(tmp_path, callbacks=spec)
    if says is None:
        capsys.readouterr()
        assert main(["sweep", "plan", str(p), "--json"]) == 0
        from depthbench_nb.sweep import expand_study, load_study

        (entry,) = expand_study(load_study(p))
        assert [c["path"] for c in entry.run.callbacks] == ["depthbench_nb.callbacks:StopAfter"]
    else:
        said = refused(capsys, ["sweep", "plan", str(p)])
        assert says in said, said
    ledger(faults=1)


# ================================================================================ 5. the exit status tells the truth
MID_RUN = {
    "sys.exit(0)": ("import sys; sys.exit(0)", 2, "failed"),
    "sys.exit(1)": ("import sys; sys.exit(1)", 2, "failed"),
    "sys.exit('bye')": ("import sys; sys.exit('bye')", 2, "failed"),
    "raise SystemExit": ("raise SystemExit", 2, "failed"),
    "KeyboardInterrupt": ("raise KeyboardInterrupt", 3, "interrupted"),
}


@pytest.mark.parametrize("hook", ["on_step_end", "on_step_start"])
@pytest.mark.parametrize("case", MID_RUN)
def test_user_code_ending_the_process_mid_run_is_a_recorded_run_with_a_checkpoint(
    case, hook, cb_dir, tiny_data, runs_dir, capsys
):
    """A callback's SystemExit mid-run (any code) is a failed run: result.json says so and why, a checkpoint holds
    the steps done, exit 2 (it was exit 0 without result.json); its KeyboardInterrupt is an interruption: exit 3, an
    `interrupted` result and a checkpoint (there was none)."""
    stmt, code, status = MID_RUN[case]
    name = module(
        cb_dir,
        f"""
        from depthbench_nb.callbacks import Callback
        class Cb(Callback):
            def {hook}(self, state):
                if state.step == 2:
                    {stmt}
        """,
    )
    capsys.readouterr()
    rc = main(["train", *TINY, "--max-steps", "4", "--data", str(tiny_data), "--callback", f"{name}:Cb", "--json"])
    out, err = capsys.readouterr()
    assert rc == code and "Traceback" not in err, (rc, out[-1000:], err[-3000:])
    (folder,) = (runs_dir / "default").glob("preln-*")
    res = read_result(folder)
    assert res is not None and res["status"] == status, res
    done = 3 if hook == "on_step_end" else 2
    assert [s for s, _ in list_checkpoints(folder)] == [done], list_checkpoints(folder)
    if status == "failed":
        assert "SystemExit" in res["error"], res
    ledger(faults=1, runs=1, survived=1)


BLOCKING = """
import os, time
from depthbench_nb.callbacks import Callback
class Block(Callback):
    def on_step_end(self, state):
        if state.step == 1:
            open(os.environ["BLOCK_FLAG"], "w").write("blocked")
            while True:
                time.sleep(0.05)
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_callback_that_never_returns_is_stopped_by_the_second_signal(sig, tmp_path, tiny_data, runs_dir):
    """A callback blocking in on_step_end: the first signal asks the run to stop at the step's end (it never comes),
    the second stops the callback: exit 3, `interrupted`, a checkpoint of the steps done (the run ignored both)."""
    (tmp_path / "blockcb.py").write_text(BLOCKING)
    flag = tmp_path / "flag"
    env = dict(
        os.environ, BLOCK_FLAG=str(flag), PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    )
    argv = ["train", *TINY, "--max-steps", "4", "--data", str(tiny_data), "--callback", "blockcb:Block"]
    proc = subprocess.Popen(CLI + argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.time()
        while not flag.exists() and time.time() - t0 < 240 and proc.poll() is None:
            time.sleep(0.1)
        assert flag.exists(), proc.communicate()[1][-2000:]
        proc.send_signal(getattr(signal, sig))
        time.sleep(1.0)
        proc.send_signal(getattr(signal, sig))
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the run ignored both signals")
    assert proc.returncode == 3, (proc.returncode, err[-2000:])
    (folder,) = (runs_dir / "default").glob("preln-*")
    assert read_result(folder)["status"] == "interrupted"
    assert [s for s, _ in list_checkpoints(folder)] == [2]
    ledger(faults=2, runs=1, survived=1)


# ============================================================================================ 6. diagnose --hf inputs
HF_CONFIGS = {  # case: (config.json changes, what the line says)
    "layers-100000.0": (dict(num_hidden_layers=100000.0), "num_hidden_layers 100000.0"),
    "layers-true": (dict(num_hidden_layers=True), "num_hidden_layers True"),
    "layers-string": (dict(num_hidden_layers="12"), "num_hidden_layers '12'"),
    "layers-2^64": (dict(num_hidden_layers=2**64), "num_hidden_layers"),
    "width-16.0": (dict(hidden_size=16.0), "hidden_size 16.0"),
    "heads-3": (dict(num_attention_heads=3, num_key_value_heads=3), "multiple"),
    "kv-heads-3": (dict(num_key_value_heads=3), "num_key_value_heads 3"),
    "vocab-100": (dict(vocab_size=100), "vocab_size 100"),
    "vocab-10^6": (dict(vocab_size=10**6), "vocab_size 1000000"),
    "width-32": (dict(hidden_size=32, head_dim=16), "hidden_size 32"),
}
DIAGNOSE_SMALL = ["--n-samples", "2", "--seq-len", "16", "--device", "cpu", "--no-figures"]


@pytest.mark.parametrize("case", HF_CONFIGS)
def test_a_model_config_of_the_wrong_numbers_is_one_line(case, llama_folder, tmp_path, capsys):
    """`diagnose --hf` on a folder whose config.json says 100000.0 or true layers, heads that do not divide the width,
    or a vocabulary or width unlike the weights': exit 2, one line, nothing written (tracebacks before)."""
    changes, says = HF_CONFIGS[case]
    folder, out = tmp_path / "model", tmp_path / "out"
    shutil.copytree(llama_folder, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))
    said = refused(
        capsys, ["diagnose", "--hf", str(folder), *DIAGNOSE_SMALL, "--out", str(out)], kinds=("config", "corrupt")
    )
    assert says in said, said
    assert not out.exists()
    ledger(faults=1)


def test_a_deep_thin_model_is_refused_for_its_time(llama_folder, tmp_path):
    """A LLaMA config of 20,000 blocks of width 8 fits in memory but its per-layer scores take L^2 block passes: refused
    from the config (`resources`), naming the cap and --no-memory-check (it ran for minutes)."""
    folder = tmp_path / "model"
    shutil.copytree(llama_folder, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(
        num_hidden_layers=20_000,
        hidden_size=8,
        intermediate_size=16,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=4,
    )
    (folder / "config.json").write_text(json.dumps(cfg))
    try:
        proc = subprocess.run(
            CLI + ["diagnose", "--hf", str(folder), *DIAGNOSE_SMALL, "--out", str(tmp_path / "o"), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("diagnose ran for minutes")
    assert proc.returncode == 2, (proc.stdout[-500:], proc.stderr[-2000:])
    obj = json.loads(proc.stdout)
    assert obj["kind"] == "resources" and "20,000 blocks" in obj["error"], obj
    assert "250,000" in obj["error"] and "--no-memory-check" in obj["error"], obj
    ledger(faults=1)


# ============================================================================================= 7. nested JSON files
def _nested(depth: int = 100_000) -> str:
    return '{"a": ' + "[" * depth + "]" * depth + "}"


NESTED = ["config.json", "manifest:inspect", "manifest:verify", "manifest:train", "run-config"]


@pytest.mark.parametrize("case", NESTED)
def test_a_file_nested_100000_deep_is_one_line(case, llama_folder, tiny_data, tmp_path, runs_dir, capsys):
    "A config.json, a data manifest or a run config nested 100,000 levels deep: one line (RecursionError tracebacks)."
    if case == "config.json":
        folder = tmp_path / "model"
        shutil.copytree(llama_folder, folder)
        (folder / "config.json").write_text(_nested())
        argv = ["diagnose", "--hf", str(folder), *DIAGNOSE_SMALL, "--out", str(tmp_path / "o")]
    elif case.startswith("manifest"):
        data = tmp_path / "data"
        shutil.copytree(tiny_data, data)
        (data / "manifest.json").write_text(_nested())
        what = case.split(":")[1]
        argv = (
            ["data", what, str(data)] if what != "train" else ["train", *TINY, "--max-steps", "1", "--data", str(data)]
        )
    else:
        (tmp_path / "params.json").write_text(_nested())
        argv = ["train", "--run-config", str(tmp_path / "params.json")]
    said = refused(capsys, argv, kinds=("corrupt", "config"))
    assert "nests deeper" in said or "not" in said, said
    ledger(faults=1)
