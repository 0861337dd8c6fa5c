"""Fine-tuning and sharing an export: a re-saved export loads where depthbench-nb is not installed (saved
with and without it), `resize_token_embeddings`, gradient checkpointing with the gradients of the plain backward for
every registered design, `output_loading_info`, `inputs_embeds`, the usual Transformers config names, HC/mHC hidden
states of width d, `shift_labels`, and the looped model's RoPE tables rebuilt after a meta-device build."""

import json
import os
import subprocess
import sys
import sysconfig
import warnings

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from depthbench_nb.config import ARCHS, ConfigError, ModelConfig
from depthbench_nb.hf import DepthBenchForCausalLM
from depthbench_nb.hf_config import DepthBenchConfig
from depthbench_nb.model import build_model

DESIGNS = ["preln", "hc", "attnres", "looped"]  # the acceptance designs, exported from tiny trained runs
TEXT = "In the beginning God created the heaven and the earth."
ENTRY_FILES = {"configuration_depthbench.py", "modeling_depthbench.py"}
AUTO_MAP = {
    "AutoConfig": "configuration_depthbench.DepthBenchConfig",
    "AutoModelForCausalLM": "modeling_depthbench.DepthBenchForCausalLM",
}


def prompt_ids(out) -> torch.Tensor:
    "Two prompts of equal length [2, T]: a KJV sentence and its tokens reversed."
    ids = AutoTokenizer.from_pretrained(out)(TEXT, return_tensors="pt").input_ids
    return torch.cat([ids, ids.flip(1)])


def tiny_hf(arch: str, seed: int = 0) -> DepthBenchForCausalLM:
    "An untrained tiny model of a registered design, moved off its init so that every tensor matters."
    kw = dict(recurrence=2) if arch == "looped" else {}
    n_layer = 20 if arch == "looped" else 4 if arch == "block_attnres" else 2
    cfg = ModelConfig(arch=arch, n_layer=n_layer, d_model=32, n_head=4, vocab_size=64, max_seq_len=64, **kw)
    model = build_model(cfg, seed=seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
    return DepthBenchForCausalLM(DepthBenchConfig(depthbench=cfg.to_dict()), model=model)


IDS = torch.randint(1, 64, (2, 9), generator=torch.Generator().manual_seed(1))  # [B, T]


def without_the_package(script: str, tmp_path, name: str) -> str:
    """Run `script` in an interpreter where `import depthbench_nb` fails (python -S: site-packages without its .pth
    files, so no editable finder and no hooks; no PYTHONPATH); returns its stdout."""
    head = f"""
import sys
sys.path.append({sysconfig.get_paths()["purelib"]!r})
try:
    import depthbench_nb
    raise SystemExit('depthbench_nb is importable: the test would not prove anything')
except ImportError:
    pass
"""
    tail = "\nassert 'depthbench_nb' not in sys.modules\n"
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / f"modules-{name}"))
    env.pop("PYTHONPATH", None)  # a checkout on PYTHONPATH would make depthbench_nb importable again
    proc = subprocess.run(
        [sys.executable, "-S", "-c", head + script + tail],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_a_resaved_export_loads_without_the_package(exported, tmp_path):
    """An export loaded (with depthbench-nb, and with remote code where it is not installed) and saved again with
    save_pretrained carries its remote code and auto_map: a process without depthbench-nb loads the new folder and
    gives the original logits."""
    outs = {arch: exported(arch)[1] for arch in DESIGNS}
    ids = {arch: prompt_ids(out) for arch, out in outs.items()}
    for arch, out in outs.items():  # saved where depthbench-nb is installed
        AutoModelForCausalLM.from_pretrained(out).save_pretrained(tmp_path / "with" / arch)
        assert ENTRY_FILES <= {p.name for p in (tmp_path / "with" / arch).iterdir()}, arch
        assert json.loads((tmp_path / "with" / arch / "config.json").read_text())["auto_map"] == AUTO_MAP
    save = f"""
from transformers import AutoModelForCausalLM
for arch, out in {json.dumps({a: str(o) for a, o in outs.items()})}.items():
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    assert type(model).__module__.startswith('transformers_modules.'), type(model).__module__
    model.save_pretrained({str(tmp_path / "without")!r} + '/' + arch)
"""
    without_the_package(save, tmp_path, "save")
    for arch in DESIGNS:
        folder = tmp_path / "without" / arch
        assert json.loads((folder / "config.json").read_text())["auto_map"] == AUTO_MAP, arch
        assert ENTRY_FILES <= {p.name for p in folder.iterdir()}, arch
    job = {arch: dict(ids=ids[arch].tolist()) for arch in DESIGNS}
    load = f"""
import json, torch
from transformers import AutoModelForCausalLM
for arch, job in json.loads({json.dumps(json.dumps(job))}).items():
    for where in ('with', 'without'):
        model = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r} + f'/{{where}}/{{arch}}', trust_remote_code=True)
        with torch.no_grad():
            logits = model(torch.tensor(job['ids'])).logits
        torch.save(logits, {str(tmp_path)!r} + f'/{{where}}-{{arch}}.pt')
"""
    without_the_package(load, tmp_path, "load")
    for arch, out in outs.items():
        original = AutoModelForCausalLM.from_pretrained(out)
        with torch.no_grad():
            want = original(ids[arch]).logits
        for where in ("with", "without"):
            got = torch.load(tmp_path / f"{where}-{arch}.pt", weights_only=True)
            assert (got - want).abs().max() <= 1e-6, (arch, where)


@pytest.mark.parametrize("arch", DESIGNS)
def test_resize_token_embeddings_up_and_down(arch, exported, tmp_path):
    _, out = exported(arch)
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = prompt_ids(out)
    emb, head = model.get_input_embeddings().weight.clone(), model.get_output_embeddings().weight.clone()
    n = emb.shape[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.resize_token_embeddings(n + 8)
    new_emb, new_head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert new_emb.shape == (n + 8, emb.shape[1]) and new_head.shape == (n + 8, head.shape[1])
    assert torch.equal(new_emb[:n], emb) and torch.equal(new_head[:n], head)  # the old rows are kept
    assert new_emb.data_ptr() != new_head.data_ptr()  # untied
    assert model.config.vocab_size == model.config.model_config().vocab_size == model.model.config.vocab_size == n + 8
    with torch.no_grad():
        logits = model(torch.cat([ids, torch.full_like(ids[:, :1], n + 7)], 1)).logits  # a new token is read
    assert logits.shape[-1] == n + 8 and torch.isfinite(logits).all()
    model.save_pretrained(tmp_path / "up")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "up")
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model(ids).logits)
    model.resize_token_embeddings(n - 8)
    assert torch.equal(model.get_input_embeddings().weight, emb[: n - 8])
    assert torch.equal(model.get_output_embeddings().weight, head[: n - 8])
    small = ids.clamp(max=n - 9)
    with torch.no_grad():
        assert model(small).logits.shape == (*small.shape, n - 8)


def saved_count(model, ids) -> int:
    "Tensors the forward pass saves for backward (activation checkpointing saves fewer)."
    count = [0]

    def pack(t):
        count[0] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids, labels=ids).loss.backward()
    return count[0]


@pytest.mark.parametrize("arch", list(ARCHS))
def test_gradient_checkpointing_gives_the_same_gradients(arch):
    "Every registered design and the looped model: the gradients with checkpointing equal those without."
    model = tiny_hf(arch).train()
    assert model.supports_gradient_checkpointing

    def gradients():
        model.zero_grad()
        n_saved = saved_count(model, IDS)
        return n_saved, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    plain_saved, plain = gradients()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # Transformers 5 renames it activation_checkpointing_enable
        model.gradient_checkpointing_enable()
    assert model.is_activation_checkpointing
    ckpt_saved, ckpt = gradients()
    assert ckpt_saved < plain_saved, (ckpt_saved, plain_saved)  # activations were recomputed, not kept
    assert plain.keys() == ckpt.keys() and len(plain) == len(list(model.parameters()))
    for k in plain:
        assert torch.allclose(plain[k], ckpt[k], rtol=1e-5, atol=1e-7), (arch, k)
    model.eval()
    with torch.no_grad():
        model(IDS)  # eval: no checkpointing, the cache works
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_disable()
    assert not model.is_activation_checkpointing and gradients()[0] == plain_saved


def test_output_loading_info(exported):
    _, out = exported("hc")
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert isinstance(model, DepthBenchForCausalLM)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]


@pytest.mark.parametrize("arch", DESIGNS)
def test_inputs_embeds_equal_input_ids(arch, exported):
    _, out = exported(arch)
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = prompt_ids(out)
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
        assert torch.equal(model(inputs_embeds=embeds).logits, model(ids).logits)
    gen = dict(max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)
    new = model.generate(ids, **gen)[:, ids.shape[1] :]
    assert torch.equal(model.generate(inputs_embeds=embeds, **gen), new)  # decoder-only: only the new tokens
    with pytest.raises(ValueError, match="exactly one of input_ids"):
        model(ids, inputs_embeds=embeds)


def test_usual_config_names_are_mapped_or_refused():
    cfg = DepthBenchConfig(
        hidden_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=40,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        vocab_size=100,
        rope_theta=5000.0,
        initializer_range=0.01,
    )
    want = dict(
        d_model=48, n_layer=3, n_head=4, n_kv_head=2, ffn_hidden=40, max_seq_len=128, norm_eps=1e-5, vocab_size=100
    )
    mc = cfg.model_config()
    assert {k: getattr(mc, k) for k in want} == want and (mc.rope_theta, mc.init_std) == (5000.0, 0.01)
    model = DepthBenchForCausalLM(cfg)
    assert len(model.model.blocks) == 3 and model.model.tok_emb.weight.shape == (100, 48)
    assert model.model.blocks[0].ffn.w1.weight.shape == (40, 48)
    # the usual names over a depthbench dict: they win, and the fields derived from them follow
    base = DepthBenchConfig(depthbench=dict(arch="hc", n_layer=2, d_model=32, n_head=4, vocab_size=64))
    wider = DepthBenchConfig(depthbench=base.depthbench, hidden_size=64, num_attention_heads=8)
    m = wider.model_config()
    assert (m.arch, m.d_model, m.n_head, m.n_kv_head, m.n_layer) == ("hc", 64, 8, 8, 2)
    assert m.ffn_hidden == ModelConfig(arch="hc", d_model=64, n_head=8).ffn_hidden
    assert (wider.hidden_size, wider.intermediate_size) == (64, m.ffn_hidden)
    for kw, names in [
        (dict(tie_word_embeddings=True), ("tie_word_embeddings", "lm_head")),
        (dict(hidden_size=64, num_attention_heads=4, head_dim=32), ("head_dim", "d_model / n_head")),
        (dict(attention_bias=True), ("attention_bias", "bias")),
        (dict(hidden_act="gelu"), ("hidden_act", "SwiGLU")),
        (dict(hidden_size=30, num_attention_heads=4), ("d_model", "n_head")),
    ]:
        with pytest.raises(ConfigError) as e:
            DepthBenchConfig(**kw)
        assert all(n in str(e.value) for n in names), (kw, str(e.value))
    assert DepthBenchConfig(hidden_size=64, num_attention_heads=4, head_dim=16).model_config().d_model == 64


@pytest.mark.parametrize("arch", ["hc", "mhc"])
def test_multistream_hidden_states_have_width_d(arch):
    model = tiny_hf(arch).eval()
    cfg = model.model.config
    n, d = cfg.hc_streams, cfg.d_model
    with torch.no_grad():
        states = model(IDS, output_hidden_states=True).hidden_states
        streams = model(IDS, output_hidden_states=True, output_hidden_streams=True).hidden_states
        _, ours = model.model(IDS, return_states=True)  # [B, T, n*d] each: the streams side by side
    assert len(states) == len(streams) == len(ours) == cfg.n_layer + 1
    # what the design reads out: HC the stream sum; mHC the mean (its default liger backend), else the sum
    collapse = "mean" if arch == "mhc" and cfg.mhc_backend == "liger" else "sum"
    assert model.model.collapse == collapse
    for s, h, o in zip(states, streams, ours):
        split = o.view(*IDS.shape, n, d)
        assert s.shape == (*IDS.shape, d) and h.shape == (*IDS.shape, n, d) and torch.equal(h, split)
        assert torch.allclose(s, split.sum(-2) if collapse == "sum" else split.mean(-2))


def test_the_loss_honours_shift_labels():
    model = tiny_hf("preln").eval()
    labels = IDS.clone()
    labels[0, 3] = -100
    with torch.no_grad():
        logits = model(IDS).logits
        by_labels = model(IDS, labels=labels).loss
        shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]  # what Transformers' Trainer passes
        assert torch.allclose(model(IDS, shift_labels=shifted).loss, by_labels)
        other = torch.randint(0, 64, IDS.shape, generator=torch.Generator().manual_seed(5))  # not IDS shifted
        want = F.cross_entropy(logits.flatten(0, 1), other.flatten())
        assert torch.allclose(model(IDS, labels=labels, shift_labels=other).loss, want)  # shift_labels win
        total = F.cross_entropy(logits.flatten(0, 1), other.flatten(), reduction="sum")
        got = model(IDS, shift_labels=other, num_items_in_batch=torch.tensor(7)).loss
        assert torch.allclose(got, total / 7)  # Trainer's gradient accumulation: a sum over the batch's items


def test_looped_rope_tables_rebuilt_after_a_meta_device_build():
    model = tiny_hf("looped").eval()
    with torch.device("meta"):
        empty = DepthBenchForCausalLM(model.config)
    assert empty.model.rope_cos.device.type == "meta"
    empty.to_empty(device="cpu")
    empty.init_weights()  # Transformers' init: our _init_weights rebuilds the derived buffers (and inits weights)
    empty.load_state_dict(model.state_dict())
    assert torch.equal(empty.model.rope_cos, model.model.rope_cos)
    assert torch.equal(empty.model.rope_sin, model.model.rope_sin)
    with torch.no_grad():
        assert torch.equal(empty.eval()(IDS).logits, model(IDS).logits)
