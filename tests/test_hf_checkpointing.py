"""Activation checkpointing of the Transformers wrapper is Transformers' own (each unit a
GradientCheckpointingLayer), and its gradients are those of the plain backward, reentrant or not (MoDA: its depth K/V
cross blocks in the forward context)."""

import warnings

import pytest
import torch
from transformers.modeling_layers import GradientCheckpointingLayer

from depthbench_nb.config import ModelConfig
from depthbench_nb.hf import DepthBenchConfig, DepthBenchForCausalLM


def _model(arch):
    cfg = ModelConfig(arch=arch, vocab_size=64, d_model=32, n_head=4, n_layer=2, max_seq_len=32)
    torch.manual_seed(0)
    return DepthBenchForCausalLM(DepthBenchConfig(depthbench=cfg.to_dict())).train()


def _grads(model, idx):
    model.zero_grad(set_to_none=True)
    model(idx, labels=idx).loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("arch", ["preln", "attnres", "moda"])
@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointing_units_and_gradients(arch, reentrant):
    model, idx = _model(arch), torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    units = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    assert len(units) == len(model.model.fsdp_units()) >= 2 and not model.is_activation_checkpointing
    plain = _grads(model, idx)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    assert all(u.gradient_checkpointing for u in units) and model.is_activation_checkpointing
    ckpt = _grads(model, idx)
    for name, g in plain.items():
        assert ckpt[name] is not None, name
        torch.testing.assert_close(ckpt[name], g, msg=name)
