"""Diagnostics of any Transformers causal LM (`depthbench-nb diagnose --hf`): tiny random-weight models of every listed
family made from their Transformers configs (no download), read through their own modules and hooks. References:
Transformers' own hidden states and logits, the model run with a layer taken out of (or moved in) its layer list,
the plain one-forward-per-perturbation loop of `depthbench_nb.diagnostics`, and the native diagnostics of a
depthbench-nb run exported as a LLaMA model (equal to 1e-5, metric by metric)."""

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    Olmo2Config,
    OlmoConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
    T5Config,
)

from depthbench_nb.cli import main
from depthbench_nb.config import ConfigError
from depthbench_nb.data import TokenData
from depthbench_nb.diagnostics import NLL_METRICS, causal_row, lm_loss
from depthbench_nb.hf_diagnostics import (
    HF_METRICS,
    BatchedRuns,
    HFDepthModel,
    diagnose_hf_model,
    find_decoder,
    locate_layout,
)

ROOT = Path(__file__).resolve().parent.parent
# the families the issue lists, each as its Transformers config at a tiny shape (4 blocks, d = 32)
FAMILIES = {
    "llama": (LlamaConfig, dict(num_key_value_heads=2)),
    "mistral": (MistralConfig, dict(num_key_value_heads=2)),
    "qwen2": (Qwen2Config, dict(num_key_value_heads=2)),
    "qwen3": (Qwen3Config, dict(num_key_value_heads=2, head_dim=8)),
    "gpt_neox": (GPTNeoXConfig, {}),
    "olmo": (OlmoConfig, {}),
    "olmo2": (Olmo2Config, {}),
    "gpt2": (GPT2Config, None),
}
LAYOUTS = {
    "gpt_neox": ("gpt_neox.layers", "gpt_neox.final_layer_norm", "lm_head"),
    "gpt2": ("transformer.h", "transformer.ln_f", "lm_head"),
}
DEFAULT = [m for m in HF_METRICS if m not in NLL_METRICS]
SHAPE = ["--n-samples", "4", "--seq-len", "16"]  # 64 tokens: more than d + 1 = 33, so usefulness is determined


@pytest.fixture(scope="session")
def tokenizer(tiny_data):
    "The package's offline BPE (4096 + specials) as a Transformers fast tokenizer."
    tok = TokenData(tiny_data).tokenizer()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|padding|>")


@pytest.fixture(scope="session")
def hf_folder(tokenizer, tmp_path_factory):
    """Factory: a saved random-weight model of a family (weights std 0.2,
    so that every block matters) with the tokenizer."""
    root, done = tmp_path_factory.mktemp("hf-models"), {}

    def make(family: str) -> Path:
        if family not in done:
            cls, extra = FAMILIES[family]
            ids = dict(
                vocab_size=len(tokenizer),
                bos_token_id=tokenizer.eos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                initializer_range=0.2,
            )
            if extra is None:
                cfg = cls(n_embd=32, n_layer=4, n_head=4, n_positions=64, **ids)
            else:
                cfg = cls(
                    hidden_size=32,
                    num_hidden_layers=4,
                    num_attention_heads=4,
                    intermediate_size=64,
                    max_position_embeddings=64,
                    pad_token_id=None,
                    **ids,
                    **extra,
                )
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(cfg).eval()
            model.save_pretrained(root / family)
            tokenizer.save_pretrained(root / family)
            done[family] = root / family
        return done[family]

    return make


def windows(n=4, T=16, seed=0, vocab=4000):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, T), generator=g), torch.randint(0, vocab, (n, T), generator=g)


def load(folder) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(folder).eval()


class layers_as:
    """The model's decoder runs its layers at `order` (indices into its own list):
    the model's forward, a modified layer list."""

    def __init__(self, model, order):
        self.model, self.order = model, order

    def __enter__(self):
        layout = locate_layout(self.model)
        self.parent, self.attr = find_decoder(self.model), layout.names["layers"].rsplit(".", 1)[-1]
        self.own, self.n = getattr(self.parent, self.attr), self.model.config.num_hidden_layers
        setattr(self.parent, self.attr, torch.nn.ModuleList([self.own[i] for i in self.order]))
        self.model.config.num_hidden_layers = len(self.order)

    def __exit__(self, *exc):
        setattr(self.parent, self.attr, self.own)
        self.model.config.num_hidden_layers = self.n


def number_pairs(a, b, path=""):
    """Every (path, x, y) of numbers at the same place in two JSON-like values (lists of the same length,
    shared dict keys)."""
    if isinstance(a, dict):
        for k in a.keys() & b.keys():
            yield from number_pairs(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), (path, len(a), len(b))
        for i, (u, v) in enumerate(zip(a, b)):
            yield from number_pairs(u, v, f"{path}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), (
            path,
            a,
            b,
        )  # undefined in both (e.g. the last block's causal mean)
    elif isinstance(a, (int, float)) and not isinstance(a, bool):
        yield path, a, b
    elif a is None:
        assert b is None, (path, a, b)


# ---- every family through its own modules ---------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_states_and_readout_are_the_models_own(family, hf_folder):
    model = load(hf_folder(family))
    m = HFDepthModel(model)
    assert tuple(m.layout.names.values()) == LAYOUTS.get(family, ("model.layers", "model.norm", "lm_head"))
    x, _ = windows()
    with torch.no_grad():
        logits, states = m(x, return_states=True)
        ref = model(x, output_hidden_states=True, use_cache=False)
    assert len(states) == 5 and (logits - ref.logits).abs().max() < 1e-5
    for layer in range(4):
        assert (states[layer] - ref.hidden_states[layer]).abs().max() < 1e-5, layer  # every layer's input
    with torch.no_grad():
        assert (
            m.layout.final_norm(states[4]) - ref.hidden_states[4]
        ).abs().max() < 1e-5  # Transformers normalises the last
        assert (m.readout(4, states[4]) - logits).abs().max() < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_skip_and_swap_are_the_model_with_a_modified_layer_list(family, hf_folder):
    model = load(hf_folder(family))
    m = HFDepthModel(model)
    x, y = windows()
    runs = BatchedRuns(m, x, y, max_rows=8)  # two variants per batch
    with torch.no_grad():
        for s in (0, 2, 3):
            with layers_as(model, [b for b in range(4) if b != s]):
                ref = float(lm_loss(model(x, use_cache=False).logits, y))
            assert runs.losses([{s: runs.identity}])[0] == pytest.approx(ref, rel=1e-5), s
        for i, j in ((0, 3), (1, 2)):
            order = list(range(4))
            order[i], order[j] = j, i
            with layers_as(model, order):
                ref = float(lm_loss(model(x, use_cache=False).logits, y))
            got = runs.losses([{i: runs.weights_of(i, j), j: runs.weights_of(j, i)}, {}])
            assert got[0] == pytest.approx(ref, rel=1e-5) and got[1] == pytest.approx(runs.loss, rel=1e-6), (i, j)
    assert all(
        torch.equal(p, q) for p, q in zip(model.state_dict().values(), load(hf_folder(family)).state_dict().values())
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_diagnostics_equal_the_plain_loop(family, hf_folder):
    "Every metric batched (shared prefix, routed rows, 3 variants per batch) equals one plain forward per perturbation."
    m = HFDepthModel(load(hf_folder(family)))
    x, y = windows()
    shared = diagnose_hf_model(m, x, y, max_rows=12)
    naive = diagnose_hf_model(m, x, y, method="naive")
    assert shared["method"] == "shared" and naive["method"] == "naive"
    assert set(DEFAULT) <= set(shared) and set(DEFAULT) <= set(naive)
    checked = 0
    for metric in set(DEFAULT) - {"latency"}:
        for path, a, b in number_pairs(shared[metric], naive[metric], metric):
            # a loss change is the difference of two fp32 losses near ln V: its rounding is a few ulps of the loss
            # (about 1e-6 each), not of the (smaller) change
            assert a == pytest.approx(b, rel=1e-5, abs=4e-6 if path.endswith("loss") else 1e-6), path
            checked += 1
    assert checked > 150
    with torch.no_grad():  # and the causal matrix against causal_row on the plain skipped forward
        _, base = m(x, return_states=True)
        row = causal_row(base, m(x, skip={1}, return_states=True)[1], 1)
    assert shared["causal"]["matrix"][1][2:] == pytest.approx(row[2:].tolist(), rel=1e-5)


# ---- the command line -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llama", "gpt_neox", "qwen2"])
def test_diagnose_hf_json_has_every_diagnostic(family, hf_folder, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["diagnose", "--hf", str(hf_folder(family)), *SHAPE, "--out", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["model"] == str(hf_folder(family)) and res["arch"] == family and res["n_layer"] == 4
    assert res["metrics"] == DEFAULT and res["skipped"] == {}
    for key in (
        "causal_frac_late_above",
        "permutation_frac_late_above",
        "block_influence_lowest",
        "pruning_cheapest",
        "angular_pruning_quarter_delta_loss",
        "usefulness_global",
        "prefill_s",
    ):
        assert key in res, key
    assert len(res["per_layer"]) == 4 and {
        "angular_to_next",
        "block_influence",
        "causal",
        "permutation",
        "pruning_delta_loss",
        "usefulness_ratio",
        "logit_lens_ce",
        "erank",
    } <= set(res["per_layer"][0])
    full = json.loads((out / "diagnostics.json").read_text())
    assert set(DEFAULT) <= set(full) and full["method"] == "shared" and full["eval_text"]["documents"] == "held-out"
    assert full["logit_lens_check"]["max_abs_logit_diff"] <= full["logit_lens_check"]["tolerance"]
    files = {Path(f).name for f in res["files"]}
    assert {
        "angular.png",
        "causal.png",
        "permutation.png",
        "pruning.png",
        "logit_lens.png",
        "block_influence.png",
        "summary.md",
        "per_layer.csv",
    } <= files
    md = (out / "summary.md").read_text()
    assert "late pairs above 0.45" in md and "late pairs above 0.15" in md and "Block Influence" in md


def test_text_file_tokens_and_progress(hf_folder, tmp_path, capsys):
    text = tmp_path / "corpus.txt"
    text.write_text(
        "\n\n".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog, again and again." for i in range(40))
    )
    out = tmp_path / "out"
    assert (
        main(
            [
                "diagnose",
                "--hf",
                str(hf_folder("llama")),
                "--text",
                str(text),
                "--tokens",
                "40",
                "--seq-len",
                "16",
                "--metrics",
                "angular,permutation",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    io = capsys.readouterr()
    assert "per block" in io.out and "swap each pair" in io.err  # the table for people, the progress bar on stderr
    full = json.loads((out / "diagnostics.json").read_text())
    assert (
        full["n_samples"] == 3
        and full["eval_text"]["text"] == str(text.resolve())
        and full["eval_text"]["documents"] == "all"
    )
    assert set(full["metrics"]) == {"angular", "permutation"}


# ---- the export round trip ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def preln_run(tiny_data, tmp_path_factory):
    "A Pre-LN run of 4 blocks trained for two steps by the trainer on the offline data."
    from depthbench_nb.run_params import make_run_config
    from depthbench_nb.runs import run_dir
    from depthbench_nb.trainer import train

    root = tmp_path_factory.mktemp("roundtrip-runs")
    run = make_run_config(
        "preln",
        L=4,
        d_model=32,
        preset="tiny",
        max_steps=2,
        eval_every=2,
        study="hfdiag",
        data=str(tiny_data),
        verbose=False,
    )
    run = run.replace(train=run.train.replace(seq_len=32, global_batch=4, eval_batches=1))
    old = os.environ.get("DEPTHBENCH_RUNS")
    os.environ["DEPTHBENCH_RUNS"] = str(root)
    try:
        assert train(run, progress=False)["status"] == "completed"
        return run_dir(run)
    finally:
        if old is None:
            os.environ.pop("DEPTHBENCH_RUNS", None)
        else:
            os.environ["DEPTHBENCH_RUNS"] = old


def test_export_round_trip_equals_the_native_diagnostics(preln_run, tiny_data, tmp_path, capsys):
    """diagnose --hf on the LLaMA export of a Pre-LN run = diagnose on the run:
    every number of every metric both compute, to 1e-5."""
    export = tmp_path / "llama"
    assert main(["export-hf", str(preln_run), str(export), "--format", "llama", "--json"]) == 0
    assert AutoConfig.from_pretrained(export).model_type == "llama"
    metrics = ",".join(
        [*(m for m in DEFAULT if m != "latency"), "domain_nll"]
    )  # latency is a timing; domain_nll: opt-in
    common = [*SHAPE, "--metrics", metrics, "--eval-limit", "3", "--no-figures", "--json"]
    capsys.readouterr()
    assert main(["diagnose", str(preln_run), *common]) == 0
    assert main(["diagnose", "--hf", str(export), "--out", str(tmp_path / "hf"), *common]) == 0
    native = json.loads((preln_run / "diagnostics" / "diagnostics.json").read_text())
    hf = json.loads((tmp_path / "hf" / "diagnostics.json").read_text())
    assert (
        hf["eval_text"]["stream_tokens"] == TokenData(tiny_data).n_val_tokens
    )  # the same held-out stream, so the same windows
    assert native["metrics"] == hf["metrics"] == metrics.split(",")
    assert hf["loss"] == pytest.approx(native["loss"], abs=1e-5)
    compared = {}
    for metric in hf["metrics"]:
        pairs = list(number_pairs(hf[metric], native[metric], metric))
        for path, a, b in pairs:
            assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (path, a, b)
        compared[metric] = len(pairs)
    assert all(n > 0 for n in compared.values()) and sum(compared.values()) > 200, compared


def test_native_export_format_is_diagnosed_with_its_own_model(tmp_path, capsys, preln_run):
    "An export in depthbench-nb's own format (model_type depthbench) runs the native diagnostics of its design."
    export = tmp_path / "native"
    assert main(["export-hf", str(preln_run), str(export), "--json"]) == 0
    capsys.readouterr()
    assert (
        main(
            [
                "diagnose",
                "--hf",
                str(export),
                *SHAPE,
                "--metrics",
                "angular,residual_path",
                "--no-figures",
                "--out",
                str(tmp_path / "o"),
                "--json",
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert res["arch"] == "preln" and res["metrics"] == [
        "angular",
        "residual_path",
    ]  # residual_path: the native design knows it


# ---- the papermill template -----------------------------------------------------------------------------------------
def test_diagnose_template_with_hf(hf_folder, tmp_path):
    out = tmp_path / "diag"
    p = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "papermill"),
            str(ROOT / "nbs" / "11_diagnose.ipynb"),
            str(tmp_path / "run.ipynb"),
            "-p",
            "hf",
            str(hf_folder("qwen2")),
            "-p",
            "out_dir",
            str(out),
            "-p",
            "n_samples",
            "4",
            "-p",
            "seq_len",
            "16",
            "-p",
            "metrics",
            "angular,block_influence,causal,logit_lens",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((out / "diagnostics.json").read_text())
    assert res["arch"] == "qwen2" and {"angular", "block_influence", "causal", "logit_lens"} <= set(res)


# ---- bad input ------------------------------------------------------------------------------------------------------
def test_bad_input_is_a_clear_error(hf_folder, tmp_path, capsys):
    t5 = tmp_path / "t5"
    T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2).save_pretrained(t5)
    short = tmp_path / "short.txt"
    short.write_text("Too short.")
    llama = str(hf_folder("llama"))
    cases = [
        (["--hf", str(tmp_path / "missing")], "cannot load a Transformers configuration"),
        (["--hf", str(t5)], "is not a causal LM that AutoModelForCausalLM can load"),
        (["--hf", llama, "--text", str(short), "--seq-len", "64"], "windows of 64 tokens need at least 65"),
        (["--hf", llama, "--text", str(tmp_path / "nope.txt")], "no such file or folder"),
        (["--hf", llama, "--metrics", "mixing"], "does not apply to a Transformers model"),
        (["--hf", llama, "--metrics", "bogus"], "unknown metric"),
        (["--hf", llama, "--device", "warp9"], "unknown device"),
        ([], "exactly one"),
        ([llama, "--hf", llama], "exactly one"),
        ([str(tmp_path), "--text", str(short)], "--text apply to --hf only"),
    ]
    for argv, message in cases:
        assert main(["diagnose", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)
        assert main(["diagnose", *argv, "--json"]) == 2
        assert message in json.loads(capsys.readouterr().out)["error"]
    model = load(llama)
    del model.model.norm  # a layout without a final norm
    with pytest.raises(
        ConfigError, match=r"LlamaForCausalLM \(model_type 'llama'\): no final norm found: looked in model for norm"
    ):
        HFDepthModel(model)


def test_bfloat16_model_keeps_float32_states(hf_folder):
    """The GPU default dtype, on the CPU: states in float32, batched runs checked at bfloat16's tolerance,
    the lens trusted."""
    model = AutoModelForCausalLM.from_pretrained(hf_folder("qwen2"), dtype=torch.bfloat16).eval()
    m = HFDepthModel(model)
    x, y = windows()
    res = diagnose_hf_model(m, x, y, ["angular", "causal", "permutation", "usefulness", "logit_lens"])
    assert res["method"] == "shared" and "tolerance 0.01" in res["method_check"]
    assert all(s.dtype == torch.float32 for s in BatchedRuns(m, x, y).states)
    assert res["logit_lens_check"]["max_abs_logit_diff"] == 0.0  # the same modules on the same bfloat16 tensor
    ref = diagnose_hf_model(
        HFDepthModel(load(hf_folder("qwen2"))), x, y, ["causal"]
    )  # float32: bfloat16 is close, not equal
    assert res["loss"] == pytest.approx(ref["loss"], rel=2e-2)


def test_a_readout_beyond_norm_and_unembedding_leaves_the_logit_lens_out():
    """Gemma2 soft-caps its logits after the unembedding:
    the lens would misread early exits, so it is left out and says why."""
    from transformers import Gemma2Config

    torch.manual_seed(0)
    cfg = Gemma2Config(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=64,
        max_position_embeddings=64,
        initializer_range=0.2,
        sliding_window=8,
        final_logit_softcapping=2.0,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=1,
    )
    m = HFDepthModel(AutoModelForCausalLM.from_config(cfg).eval())
    x, y = windows(vocab=64)
    res = diagnose_hf_model(m, x, y)
    assert "logit_lens" not in res and "soft-cap" in res["skipped"]["logit_lens"]
    assert res["method"] == "shared"  # its alternating sliding-window layers batch as well
    with pytest.raises(ConfigError, match="does more after its unembedding"):
        diagnose_hf_model(m, x, y, ["logit_lens"])
