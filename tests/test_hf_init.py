"""Transformers' initialisation of missing weights: `_init_weights` applies build_model's init rule to each
module a checkpoint did not provide, and never overwrites a loaded tensor. References: a fresh `build_model` (its
distributions and its deterministic tensors) and the loaded state dict itself."""

import contextlib

import pytest
import torch
from transformers import PreTrainedModel, set_seed

from depthbench_nb.config import ARCHS, ModelConfig
from depthbench_nb.hf import DepthBenchForCausalLM
from depthbench_nb.hf_config import DepthBenchConfig
from depthbench_nb.model import build_model

DESIGNS = sorted(ARCHS)  # every registered design, the looped model included


def tiny_config(arch: str) -> ModelConfig:
    kw = dict(recurrence=2) if arch == "looped" else {}
    n_layer = 6 if arch == "looped" else 4 if arch == "block_attnres" else 2
    return ModelConfig(arch=arch, n_layer=n_layer, d_model=32, n_head=4, vocab_size=64, max_seq_len=64, **kw)


@contextlib.contextmanager
def seeded_module_init(seed: int = 42):
    "Transformers' seeded_weight_init (tests/test_modeling_common.py): the same seed before each module's init."
    original = PreTrainedModel._initialize_weights

    def seeded(*args, **kwargs):
        set_seed(seed)
        original(*args, **kwargs)

    PreTrainedModel._initialize_weights = seeded
    try:
        yield
    finally:
        PreTrainedModel._initialize_weights = original


def deterministic(cfg: ModelConfig) -> dict[str, bool]:
    "Parameter name -> whether build_model's init of it is the same under two seeds (zeros, ones, identities...)."
    a, b = build_model(cfg, seed=0).state_dict(), build_model(cfg, seed=1).state_dict()
    return {k: torch.equal(a[k], b[k]) for k in a}


def check_follows_init(params: dict[str, torch.Tensor], cfg: ModelConfig, names=None) -> list[str]:
    """Names in `names` (all by default) whose tensor breaks build_model's rule: a deterministic tensor must equal
    build_model's, a random one must be finite with build_model's std (±20%, tensors of >= 256 entries)."""
    ref, fixed, bad = build_model(cfg, seed=0).state_dict(), deterministic(cfg), []
    for k in names if names is not None else ref:
        p, q = params[k].float(), ref[k].float()
        if not torch.isfinite(p).all():
            bad.append(f"{k}: not finite")
        elif fixed[k]:
            if not torch.equal(p, q):
                bad.append(f"{k}: differs from build_model's deterministic init")
        elif p.numel() >= 256 and abs(p.std().item() / q.std().item() - 1) > 0.2:
            bad.append(f"{k}: std {p.std().item():.4g}, build_model's {q.std().item():.4g}")
    return bad


@pytest.mark.parametrize("arch", DESIGNS)
def test_every_missing_weight_follows_build_models_init(arch):
    cfg = tiny_config(arch)
    hf = DepthBenchForCausalLM.from_pretrained(None, config=DepthBenchConfig(depthbench=cfg.to_dict()), state_dict={})
    assert not [k for k, v in hf.state_dict().items() if v.device.type == "meta"]
    assert check_follows_init(hf.model.state_dict(), cfg) == []


@pytest.mark.parametrize("arch", DESIGNS)
def test_missing_weights_equal_a_seeded_init_like_transformers_common_test(arch):
    "test_can_init_all_missing_weights: the class's own init and from_pretrained(None, state_dict={}) agree exactly."
    hf_cfg = DepthBenchConfig(depthbench=tiny_config(arch).to_dict())
    with seeded_module_init():
        from_init = DepthBenchForCausalLM(hf_cfg)
        from_pretrained = DepthBenchForCausalLM.from_pretrained(None, config=hf_cfg, state_dict={})
    a, b = from_init.state_dict(), from_pretrained.state_dict()
    assert sorted(a) == sorted(b)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


def trained(cfg: ModelConfig) -> torch.nn.Module:
    "build_model's model moved off its init (every tensor distinguishable from a fresh init)."
    model = build_model(cfg, seed=3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05 + 0.1)
    return model


@pytest.mark.parametrize("arch", ["preln", "deepnorm", "keel", "hc", "mhc", "attnres", "moda", "looped"])
def test_loaded_weights_are_kept_and_only_missing_ones_initialised(arch):
    cfg = tiny_config(arch)
    sd = {f"model.{k}": v for k, v in trained(cfg).state_dict().items()}
    keys = sorted(sd)
    loaded = {k: sd[k] for k in keys[::2]}  # every other tensor in the checkpoint, the rest missing
    hf_cfg = DepthBenchConfig(depthbench=cfg.to_dict())
    hf = DepthBenchForCausalLM.from_pretrained(None, config=hf_cfg, state_dict=dict(loaded))
    got = hf.state_dict()
    assert [k for k in loaded if not torch.equal(got[k], loaded[k])] == []
    missing = [k.removeprefix("model.") for k in keys[1::2]]
    assert check_follows_init(hf.model.state_dict(), cfg, missing) == []


@pytest.mark.parametrize("arch", ["hc", "looped"])
def test_a_wrapped_model_keeps_its_weights(arch):
    "DepthBenchForCausalLM(config, model=...) runs post_init: the given model's tensors stay as they are."
    model = trained(tiny_config(arch))
    want = {k: v.clone() for k, v in model.state_dict().items()}
    hf = DepthBenchForCausalLM(DepthBenchConfig(depthbench=model.config.to_dict()), model=model)
    hf.init_weights()  # an explicit re-run of Transformers' init as well
    assert [k for k, v in hf.model.state_dict().items() if not torch.equal(v, want[k])] == []
