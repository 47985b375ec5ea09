"""`flex`: FlexAttention over a BlockMask built analytically (no s x s tensor); compiled or
eager as the model config's `attention_compile` says (auto: compiled on CUDA). On CPU forward
only, compiled or not (torch has no FlexAttention backward there): evaluation, not training."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention.flex_attention import flex_attention

from megatron_biglm.model.attention_masks import flex_split_block_mask

from .protocol import DeriveOptions

NO_CPU_BACKWARD = ("attention_backend 'flex' trains on CUDA only: torch has no FlexAttention backward on "
                   "CPU; use sdpa (or auto) to train here, flex on CPU is for evaluation")


@functools.lru_cache(maxsize=2)
def flex_attention_fn(compiled: bool):
    """FlexAttention, compiled (fused kernel, no s x s scores) or eager (materialises scores)."""
    return torch.compile(flex_attention, dynamic=False) if compiled else flex_attention


@dataclass(frozen=True)
class FlexMask:
    """A batch's BlockMask and whether the kernel runs compiled."""

    block_mask: Any
    compiled: bool


class FlexBackend:
    name = "flex"
    dtypes = None
    supports_dropout = False
    megatron_native = False

    def unavailable(self, *, training: bool = True) -> str | None:
        return NO_CPU_BACKWARD if training and not torch.cuda.is_available() else None

    def derive(self, split, options: DeriveOptions) -> FlexMask:
        block_mask = flex_split_block_mask(split.to(options.device), split.seq_len,
                                           block_size=options.flex_block_size)
        return FlexMask(block_mask, options.compile_flex)

    def forward(self, core, query, key, value, derived: FlexMask) -> torch.Tensor:
        if core.attention_dropout_p() > 0:
            raise NotImplementedError("FlexAttention has no attention dropout; use attention_backend sdpa or "
                                      "flash with attention_dropout > 0")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        flex = flex_attention_fn(compiled=derived.compiled)
        try:
            out = flex(q, k, v, block_mask=derived.block_mask, scale=core.softmax_scale,
                       enable_gqa=q.shape[1] != k.shape[1])
        except NotImplementedError as exc:
            if "backward on CPU" not in str(exc):
                raise
            raise NotImplementedError(
                f"{exc} (torch {torch.__version__}, compiled or not). To train on CPU set "
                "model.attention_backend to sdpa or auto; flex on CPU is for evaluation") from exc
        return out.permute(2, 0, 1, 3)

    def describe(self, dtype, options: DeriveOptions) -> str:  # noqa: ARG002
        return "FlexAttention, " + ("compiled (torch.compile)" if options.compile_flex else "eager (not compiled)")
