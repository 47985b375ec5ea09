"""`local`: megatron's unfused `DotProductAttention` with the dense mask in megatron's
convention (True = masked out): the reference every other backend is tested against."""
from __future__ import annotations

import torch

from megatron_biglm.model.attention_masks import dense_split_mask

from .protocol import AttentionBackend


class LocalBackend(AttentionBackend):
    name = "local"
    megatron_native = True

    def derive(self, split, options) -> torch.Tensor:
        return dense_split_mask(split.to(options.device), split.seq_len)

    def forward(self, core, query, key, value, derived) -> torch.Tensor:
        return core.unfused(query, key, value, derived)

    def describe(self, dtype, options) -> str:  # noqa: ARG002
        return "megatron's unfused DotProductAttention"
