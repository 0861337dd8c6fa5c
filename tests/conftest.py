"""Shared test settings: offline, single-threaded, and every file the package writes goes to a temporary folder.

Hermetic: the session gets its own runs folder (DEPTHBENCH_RUNS) and data cache (DEPTHBENCH_CACHE) in a scratch folder
made here, whatever the environment says, so a demo, a sweep or an earlier test run in the checkout (its
`papermill_runs/`) or in the user's cache can change no result; xdist workers inherit the controller's folders."""

import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")

if not os.environ.get("DEPTHBENCH_TEST_SCRATCH"):  # the controlling process (or the only one)
    _SCRATCH = tempfile.mkdtemp(prefix="depthbench-tests-")
    os.environ.update(
        DEPTHBENCH_TEST_SCRATCH=_SCRATCH,
        DEPTHBENCH_RUNS=os.path.join(_SCRATCH, "runs"),
        DEPTHBENCH_CACHE=os.path.join(_SCRATCH, "cache"),
    )
else:
    _SCRATCH = None  # an xdist worker: the controller's folders

import pytest  # noqa: E402


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    "A private DEPTHBENCH_RUNS folder for tests that write run records."
    d = tmp_path / "runs"
    monkeypatch.setenv("DEPTHBENCH_RUNS", str(d))
    return d


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """The offline default data (source 'sample', tokenizer 'bpe:4096': what the tiny preset trains on), prepared
    once per test session into a folder shared by xdist workers (prepare is locked and idempotent); returns its path."""
    from depthbench_nb.config import DataConfig
    from depthbench_nb.data import prepare

    folder = tmp_path_factory.getbasetemp().parent / "depthbench-data" / "sample-bpe4096"
    return prepare(DataConfig(source="sample", tokenizer="bpe:4096", path=str(folder)), progress=False)


# ---------------------------------------------------------------------------------------------------------------
# The fault suite's one-line summary (tests/test_faults.py): each fault test appends what it injected to a ledger
# file; the controlling process (xdist's, or the only one) adds it up at the end of the session.
def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller; xdist workers inherit the variable
        import tempfile
        from pathlib import Path

        fd, path = tempfile.mkstemp(prefix="depthbench-faults-", suffix=".jsonl")
        os.close(fd)
        os.environ["DEPTHBENCH_FAULT_LEDGER"] = path
        config._fault_ledger = Path(path)


def pytest_terminal_summary(terminalreporter, config):
    import json

    ledger = getattr(config, "_fault_ledger", None)
    rows = (
        [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
        if ledger and ledger.exists()
        else []
    )
    if not rows:
        return
    total = {k: sum(r.get(k, 0) for r in rows) for k in ("faults", "runs", "survived", "lost")}
    terminalreporter.write_line(
        f"fault suite: faults injected {total['faults']}, runs survived {total['survived']} of "
        f"{total['runs']}, records lost {total['lost']}"
    )


def pytest_unconfigure(config):
    ledger = getattr(config, "_fault_ledger", None)
    if ledger is not None:
        ledger.unlink(missing_ok=True)
    if _SCRATCH is not None and not hasattr(config, "workerinput") and not os.environ.get("DEPTHBENCH_KEEP_SCRATCH"):
        shutil.rmtree(_SCRATCH, ignore_errors=True)


@pytest.fixture(scope="session")
def trained_run(tiny_data, tmp_path_factory):
    """Factory: a real run folder of a design, trained for two steps by the trainer (L2 d32; looped: the tiny looped
    model), once per design and test session; returns the run folder."""
    from depthbench_nb.run_params import make_run_config
    from depthbench_nb.runs import run_dir
    from depthbench_nb.trainer import train

    root, done = tmp_path_factory.mktemp("trained-runs"), {}

    def make(arch: str, **options):
        key = (arch, tuple(sorted(options.items())))
        if key not in done:
            shape = {} if arch == "looped" else dict(L=4 if arch == "block_attnres" else 2, d_model=32)
            run = make_run_config(
                arch,
                preset="tiny",
                max_steps=2,
                eval_every=2,
                study="hf",
                data=str(tiny_data),
                verbose=False,
                **shape,
                **options,
            )
            run = run.replace(train=run.train.replace(seq_len=32, global_batch=4, eval_batches=1))
            old = os.environ.get("DEPTHBENCH_RUNS")
            os.environ["DEPTHBENCH_RUNS"] = str(root)
            try:
                assert train(run, progress=False)["status"] == "completed"
                done[key] = run_dir(run)
            finally:
                if old is None:
                    os.environ.pop("DEPTHBENCH_RUNS", None)
                else:
                    os.environ["DEPTHBENCH_RUNS"] = old
        return done[key]

    return make


@pytest.fixture(scope="session")
def exported(trained_run, tmp_path_factory):
    """Factory: (run folder, export folder) of a design, exported once per session (read-only: a test that writes
    saves elsewhere)."""
    from depthbench_nb.hf_export import export_hf

    root, done = tmp_path_factory.mktemp("exports"), {}

    def make(arch: str):
        if arch not in done:
            run = trained_run(arch)
            export_hf(run, root / arch)
            done[arch] = (run, root / arch)
        return done[arch]

    return make


@pytest.fixture(scope="session")
def llama_folder(tiny_data, tmp_path_factory):
    """A tiny LLaMA (1 block, d 16) saved by Transformers with the package's offline BPE: a folder diagnose --hf
    reads (copy it to change it)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from depthbench_nb.data import TokenData

    tok = PreTrainedTokenizerFast(
        tokenizer_object=TokenData(tiny_data).tokenizer(), eos_token="<|endoftext|>", pad_token="<|padding|>"
    )
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("hf-llama") / "llama"
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
