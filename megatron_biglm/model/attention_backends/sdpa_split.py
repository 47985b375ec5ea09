"""`sdpa_split`: two mask-free SDPA calls per group of samples sharing a split (prefix ->
prefix, suffix -> valid keys): flash/cuDNN SDPA on CUDA, on any device; groups from the host."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from megatron_biglm.model.attention_masks import SplitGroups, grouped_split_sdpa, split_groups

from .protocol import AttentionBackend


class SdpaSplitBackend(AttentionBackend):
    name = "sdpa_split"

    def derive(self, split, options) -> SplitGroups:  # noqa: ARG002
        return split_groups(split, split.seq_len)  # from the host tensors: no device sync

    def forward(self, core, query, key, value, derived: SplitGroups) -> torch.Tensor:
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, h, s, d]
        sdpa = functools.partial(F.scaled_dot_product_attention, dropout_p=core.attention_dropout_p(),
                                 scale=core.softmax_scale, enable_gqa=q.shape[1] != k.shape[1])
        return grouped_split_sdpa(q, k, v, derived, sdpa).permute(2, 0, 1, 3)

    def describe(self, dtype, options) -> str:  # noqa: ARG002
        return "torch scaled_dot_product_attention, two mask-free calls per group of equal splits"
