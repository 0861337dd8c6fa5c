"""Transformers: every design and the looped model, trained by the trainer, exported with `depthbench-nb export-hf`,
loaded with AutoModelForCausalLM (package installed, and package absent through trust_remote_code): logits equal to
ours (fp32, 1e-5), greedy generate() equal to our cached generation; the Llama export for Pre-LN/LNS; bad input."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from depthbench_nb.cli import main
from depthbench_nb.config import ARCHS
from depthbench_nb.hf import DepthBenchForCausalLM, GenerationCache
from depthbench_nb.hf_config import DepthBenchConfig
from depthbench_nb.hf_export import _PAPERS, _RECORD_NAME, load_for_eval
from depthbench_nb.interop import generate as our_generate
from depthbench_nb.runs import write_params
from depthbench_nb.runs import load_run

ROOT = Path(__file__).resolve().parent.parent
DESIGNS = list(ARCHS)  # the ten DepthBench designs and the looped model
TEXT = "In the beginning God created the heaven and the earth."
NEW_TOKENS = 8


def prompts(tokenizer) -> torch.Tensor:
    "Two prompts of equal length [2, T]: a KJV sentence and its tokens reversed."
    ids = tokenizer(TEXT, return_tensors="pt").input_ids  # [1, T]
    return torch.cat([ids, ids.flip(1)])  # [2, T]


@pytest.mark.parametrize("arch", DESIGNS)
def test_export_loads_with_auto_classes_and_matches_ours(arch, exported):
    run, out = exported(arch)
    ours, cfg = load_run(run)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model) is DepthBenchForCausalLM and type(AutoConfig.from_pretrained(out)) is DepthBenchConfig
    assert model.config.model_config() == cfg.model and not model.training
    tok = AutoTokenizer.from_pretrained(out)
    idx = prompts(tok)
    with torch.no_grad():
        diff = (model(idx).logits - ours(idx)).abs().max().item()
    assert diff <= 1e-5, diff
    # greedy generate() with our KV cache == our own cached greedy loop (no end-of-text stop on either side)
    gen = model.generate(idx, generation_config=GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False))
    assert torch.equal(gen, our_generate(ours, idx, NEW_TOKENS))
    # the exported tokenizer is the run's own
    run_tok = load_for_eval(run)["tokenizer"]
    assert tok(TEXT).input_ids == run_tok.encode(TEXT).ids and tok.eos_token_id == model.config.eos_token_id == 0


def test_generate_uses_our_cache_and_stops_at_eos(exported):
    _, out = exported("hc")
    model = AutoModelForCausalLM.from_pretrained(out)
    idx = prompts(AutoTokenizer.from_pretrained(out))[:1]
    step = model(idx)
    assert isinstance(step.cache, GenerationCache) and step.cache.get_seq_length() == idx.shape[1]
    nxt = step.logits[:, -1:].argmax(-1)  # one cached step == the uncached forward
    with torch.no_grad():
        cached = model(nxt, cache=step.cache).logits[:, -1]
        full = model(torch.cat([idx, nxt], 1), use_cache=False).logits[:, -1]
    assert (cached - full).abs().max() <= 1e-5
    # the first generated token made the end-of-text token: generation stops there, as generate() does with eos
    eos = int(nxt)
    gen = model.generate(idx, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    assert gen.shape[1] == idx.shape[1] + 1 and int(gen[0, -1]) == eos
    # a cache passed in by the caller fills as generate() runs, and a second call continues from it
    ours, cache = model.model, GenerationCache()
    first = model.generate(idx, max_new_tokens=3, do_sample=False, cache=cache, eos_token_id=None, pad_token_id=0)
    more = model.generate(first, max_new_tokens=3, do_sample=False, cache=cache, eos_token_id=None, pad_token_id=0)
    assert torch.equal(more, our_generate(ours, idx, 6)) and cache.get_seq_length() == idx.shape[1] + 5
    beams = model.generate(idx, max_new_tokens=4, do_sample=False, num_beams=2, eos_token_id=None, pad_token_id=0)
    assert beams.shape == (1, idx.shape[1] + 4)  # beam search reorders our cache


def test_labels_give_the_shifted_cross_entropy_and_a_padded_row_its_own_logits(exported):
    _, out = exported("attnres")
    model = AutoModelForCausalLM.from_pretrained(out)
    idx = prompts(AutoTokenizer.from_pretrained(out))
    res = model(idx, labels=idx)
    want = torch.nn.functional.cross_entropy(res.logits[:, :-1].flatten(0, 1), idx[:, 1:].flatten())
    assert torch.allclose(res.loss, want) and res.cache is None
    states = model(idx, output_hidden_states=True).hidden_states
    assert len(states) == model.config.num_hidden_layers + 1  # embedding + one state per block
    mask = torch.ones_like(idx)
    mask[0, 0] = 0  # row 0 left-padded by one token: its logits are those of the row without it
    with torch.no_grad():
        diff = (model(idx, attention_mask=mask).logits[0, 1:] - model(idx[:1, 1:]).logits[0]).abs().max()
    assert diff <= 1e-5  # tests/test_hf_padding.py: every design, generate, training, the cache


def test_remote_code_without_the_package(exported, tmp_path):
    """trust_remote_code=True in an interpreter where depthbench_nb cannot be imported: every design's export loads from
    the code it carries and gives our logits and our greedy generation."""
    outs = {arch: exported(arch) for arch in DESIGNS}
    ids = {arch: prompts(AutoTokenizer.from_pretrained(out)).tolist() for arch, (_, out) in outs.items()}
    job = tmp_path / "job.json"
    job.write_text(json.dumps({arch: dict(out=str(out), ids=ids[arch]) for arch, (_, out) in outs.items()}))
    script = f"""
import json, sys
# site-packages without its .pth files: no editable finder, no hooks
sys.path.append({sysconfig.get_paths()["purelib"]!r})
try:
    import depthbench_nb
    raise SystemExit('depthbench_nb is importable: the test would not prove anything')
except ImportError:
    pass
import torch
from transformers import AutoModelForCausalLM, GenerationConfig
res = {{}}
for arch, job in json.load(open({str(job)!r})).items():
    model = AutoModelForCausalLM.from_pretrained(job['out'], trust_remote_code=True)
    assert 'depthbench_nb' not in type(model).__module__, type(model).__module__
    idx = torch.tensor(job['ids'])
    with torch.no_grad(): logits = model(idx).logits
    gen = model.generate(idx, generation_config=GenerationConfig(max_new_tokens={NEW_TOKENS}, do_sample=False))
    torch.save(dict(logits=logits, gen=gen), {str(tmp_path)!r} + f'/{{arch}}.pt')
    res[arch] = type(model).__module__
assert 'depthbench_nb' not in sys.modules
print(json.dumps(res))
"""
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"))
    env.pop("PYTHONPATH", None)  # a checkout on PYTHONPATH would make depthbench_nb importable again
    proc = subprocess.run(
        [sys.executable, "-S", "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    modules = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(modules) == set(DESIGNS) and all(m.startswith("transformers_modules.") for m in modules.values())
    for arch, (run, _) in outs.items():
        ours, _ = load_run(run)
        got = torch.load(tmp_path / f"{arch}.pt", weights_only=True)
        idx = torch.tensor(ids[arch])
        with torch.no_grad():
            assert (got["logits"] - ours(idx)).abs().max() <= 1e-5, arch
        assert torch.equal(got["gen"], our_generate(ours, idx, NEW_TOKENS)), arch


def test_model_card_and_record(exported):
    run, out = exported("looped")
    card = (out / "README.md").read_text()
    record = json.loads((out / _RECORD_NAME).read_text())
    result = json.loads((run / "result.json").read_text())
    assert card.startswith("---\nlibrary_name: transformers") and "- custom_code" in card
    assert f"# {result['run_id']}" in card and "`looped` (looped)" in card and "recurrence=" in card
    assert f"{result['tokens']:,}" in card and f"{result['final_val_loss']:.4f} nats/token" in card
    assert _PAPERS["looped"]["arxiv"] in card and result["provenance"]["git_commit"] in card
    assert record["result"]["final_val_loss"] == result["final_val_loss"] and "hostname" not in record["provenance"]
    _, out = exported("keel")
    assert _PAPERS["depthbench"]["title"] in (out / "README.md").read_text()
    cfg = json.loads((out / "config.json").read_text())
    assert (
        cfg["model_type"] == "depthbench"
        and cfg["auto_map"]["AutoModelForCausalLM"] == "modeling_depthbench.DepthBenchForCausalLM"
    )


@pytest.mark.parametrize("arch", ["preln", "lns"])
def test_llama_export_stays_for_preln_and_lns(arch, trained_run, tmp_path, capsys):
    run = trained_run(arch)
    capsys.readouterr()  # the fixture's training log, when it trains here
    assert main(["export-hf", str(run), str(tmp_path / "llama"), "--format", "llama", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "llama"
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "llama")
    assert type(model).__name__ == "LlamaForCausalLM"
    ours, _ = load_run(run)
    idx = prompts(AutoTokenizer.from_pretrained(tmp_path / "llama"))
    with torch.no_grad():
        assert (model(idx).logits - ours(idx)).abs().max() <= 1e-5


def test_bad_input_is_a_clear_error(trained_run, tmp_path, capsys):
    run = trained_run("preln")
    cases = [
        ([str(tmp_path / "missing"), str(tmp_path / "o")], "is not a folder"),
        ([str(tmp_path), str(tmp_path / "o")], "not a run folder (no params.json)"),
        (
            [str(run), str(tmp_path / "o"), "--format", "llama", "--tokenizer", str(tmp_path / "nope.json")],
            "no such tokenizer.json",
        ),
    ]
    # a run folder whose checkpoint was never completed (training did not reach one)
    empty = tmp_path / "runs" / "hf" / "unfinished"
    from depthbench_nb.runs import read_params

    write_params(empty, read_params(run))
    cases.append(([str(empty), str(tmp_path / "o")], "has no complete checkpoint to export yet"))
    hc = trained_run("hc")
    cases.append(([str(hc), str(tmp_path / "o"), "--format", "llama"], "exports preln, lns only"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    cases.append(([str(run), str(tmp_path / "full")], "is not empty; pass --force"))
    for argv, message in cases:
        assert main(["export-hf", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine" and not (tmp_path / "o").exists()
    assert main(["export-hf", str(run), str(tmp_path / "full"), "--force", "--json"]) == 0  # --force replaces it
    assert not (tmp_path / "full" / "keep.txt").exists() and (tmp_path / "full" / "model.safetensors").is_file()
    assert not list(tmp_path.glob(".*partial*"))  # nothing half-written left


def test_registration_on_package_import_in_any_order(tmp_path):
    "Without the startup .pth (python -S), `import depthbench_nb` alone makes the Auto classes know 'depthbench'."
    from depthbench_nb.model import build_model
    from depthbench_nb.config import ModelConfig

    m = build_model(ModelConfig(arch="mhc", n_layer=2, d_model=32, n_head=4, vocab_size=64, max_seq_len=64))
    DepthBenchForCausalLM(DepthBenchConfig(depthbench=m.config.to_dict()), model=m).save_pretrained(tmp_path / "m")
    head = f"import sys; sys.path.append({sysconfig.get_paths()['purelib']!r}); sys.path.insert(0, {str(ROOT)!r})\n"
    load = f"print(type(AutoModelForCausalLM.from_pretrained({str(tmp_path / 'm')!r})).__name__)\n"
    orders = {  # the hook installed before Transformers loads, and after it has (the first try fails: the control)
        "package first": "import depthbench_nb\nfrom transformers import AutoModelForCausalLM\n",
        "transformers first": "import transformers.modeling_utils\n"
        "from transformers import AutoConfig, AutoModelForCausalLM\n"
        # trust_remote_code=False: the saved folder carries remote code, which must not stand in for the registration
        f"try: AutoConfig.from_pretrained({str(tmp_path / 'm')!r}, trust_remote_code=False)\n"
        "except ValueError: pass\nelse: print('KNOWN BEFORE IMPORT')\n"
        "import depthbench_nb\n",
    }
    for name, body in orders.items():
        proc = subprocess.run(
            [sys.executable, "-S", "-c", head + body + load], capture_output=True, text=True, cwd=tmp_path, timeout=300
        )
        assert proc.returncode == 0 and proc.stdout.split() == ["DepthBenchForCausalLM"], (
            name,
            proc.stdout,
            proc.stderr[-2000:],
        )


@pytest.mark.parametrize("first", ["depthbench_nb.hf", "transformers"])
def test_the_auto_classes_know_depthbench_whichever_is_imported_first(first, tmp_path):
    """Importing depthbench_nb.hf loads Transformers' Auto classes halfway through its own import: the model type is
    registered all the same, with no warning, and a saved model loads as our class without remote code."""
    second = "transformers" if first == "depthbench_nb.hf" else "depthbench_nb.hf"
    code = f"""
import {first}, {second}
import torch
from transformers import AutoModelForCausalLM
from depthbench_nb.config import ModelConfig
from depthbench_nb.hf import DepthBenchForCausalLM
from depthbench_nb.hf_config import DepthBenchConfig
from depthbench_nb.model import build_model
m = build_model(ModelConfig(arch='preln', n_layer=1, d_model=16, n_head=2, vocab_size=32, max_seq_len=16))
DepthBenchForCausalLM(DepthBenchConfig(depthbench=m.config.to_dict()), model=m).save_pretrained({str(tmp_path)!r})
print(type(AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})).__module__)
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["depthbench_nb.hf"]
    assert "depthbench-nb:" not in proc.stderr, proc.stderr[-2000:]  # the hook warns when a registration fails
