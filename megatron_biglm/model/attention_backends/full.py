"""Full attention (nothing derived: split None or all 0 and no padded row, as the variants
`mlm`/`no_attn` give): the fastest unmasked kernel here, whatever the configured backend.
flash-attn where it runs (CUDA, fp16/bf16), else SDPA without a mask."""
from __future__ import annotations

import torch

from .flash import flash_attn_available, flash_full_attention
from .protocol import HALF_DTYPES
from .sdpa import sdpa_attention


def full_attention(core, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    if query.is_cuda and query.dtype in HALF_DTYPES and flash_attn_available():
        return flash_full_attention(core, query, key, value)
    return sdpa_attention(core, query, key, value, None)
