"""DenseFormer-style depth-weighted averages (arXiv 2402.02622) as a depthbench-nb design, registered through the
entry point group `depthbench_nb.designs` (see pyproject.toml): depthbench-nb loads it on its first registry lookup."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn

from depthbench_nb.config import ConfigError, Design, DesignOptions, ModelConfig
from depthbench_nb.model import ForwardContext, PreLNBlock, ResidualTransformer

__all__ = ["DenseFormerOptions", "DenseFormerBlock", "build_denseformer", "dwa_sources", "design"]

STATE_KEY = "denseformer"  # this design's entry in ForwardContext.state: position -> depth output of this pass


@dataclass(frozen=True)
class DenseFormerOptions(DesignOptions):
    "The design's one option, with its default and rule."

    dwa_dilation: int = field(
        default=1, metadata={"help": "a positive integer k: each average reads every k-th earlier output (§3.2)"}
    )

    def validate(self):
        if self.dwa_dilation < 1:
            raise ConfigError(f"dwa_dilation must be a positive integer, got {self.dwa_dilation}")


def dwa_sources(index: int, dilation: int) -> list[int]:
    "Positions the average after block `index` reads: 0 is the embedding, j > 0 the output of block j - 1."
    return [j for j in range(index + 2) if (index + 1 - j) % dilation == 0]


class DenseFormerBlock(PreLNBlock):
    "A Pre-LN block followed by its depth-weighted average over the embedding and the earlier block outputs."

    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__(cfg, index)
        self.sources = dwa_sources(index, cfg.dwa_dilation)
        self.dwa = nn.Parameter(torch.empty(len(self.sources)))  # α over `sources`, the last one is this block's

    @classmethod
    def begin_forward(cls, ctx: ForwardContext, model: nn.Module) -> None:
        "Each forward pass starts with no outputs: the blocks share them through ctx.state."
        ctx.state[STATE_KEY] = {}

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        "x [B, T, d] -> the weighted average [B, T, d] of the outputs so far (this block's included)"
        outputs = ctx.state[STATE_KEY]
        outputs.setdefault(self.index, x)  # the embedding before block 0 (or the state a skipped block passed on)
        outputs[self.index + 1] = super().forward(x, ctx)
        mixed = self.dwa[-1] * outputs[self.index + 1]
        for weight, j in zip(self.dwa[:-1], self.sources[:-1]):
            if j in outputs:  # a skipped block leaves no output
                mixed = mixed + weight * outputs[j]
        return mixed

    @torch.no_grad()
    def init_design(self, generator: Optional[torch.Generator] = None) -> None:
        "α = 1 on this block's own output, 0 elsewhere: the model starts as Pre-LN (the paper's init)."
        self.dwa.zero_()
        self.dwa[-1] = 1.0


def build_denseformer(cfg: ModelConfig) -> ResidualTransformer:
    return ResidualTransformer(cfg, DenseFormerBlock)


def _n_weights(cfg: ModelConfig) -> int:
    return sum(len(dwa_sources(b, cfg.dwa_dilation)) for b in range(cfg.n_layer))


def _extra_params(cfg: ModelConfig) -> tuple[int, int]:
    "One weight per (block, source) inside the blocks, nothing outside."
    return _n_weights(cfg), 0


def _forward_flops(cfg: ModelConfig) -> float:
    "A multiply and an add per weight and channel."
    return 2.0 * _n_weights(cfg) * cfg.d_model


def _check_init(model: ResidualTransformer, idx: torch.Tensor, atol: float) -> Optional[str]:
    for b, block in enumerate(model.blocks):
        want = torch.zeros_like(block.dwa)
        want[-1] = 1.0
        if not torch.equal(block.dwa, want):
            return f"block {b}: DWA weights {block.dwa.tolist()} are not the identity (1 on its own output)"
    return None


def design() -> Design:
    "The registry entry (the entry point): everything depthbench-nb asks of a design."
    return Design(
        "denseformer",
        "residual",
        "DenseFormer: after each block, a learned depth-weighted average of all earlier outputs (arXiv 2402.02622)",
        build=build_denseformer,
        extra_params=_extra_params,
        forward_flops=_forward_flops,
        check_init=_check_init,
        metrics=("usefulness",),
        importer="DenseFormer has no OLMo-core fork checkpoints to import",
        options=DenseFormerOptions,
    )
