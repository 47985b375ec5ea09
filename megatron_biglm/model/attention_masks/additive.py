"""The split rule as an additive float mask, the form HF models take in ``attention_mask``.

HF eager attention *adds* a 4D mask to the scores, so a bool mask would be silently wrong
there (sdpa would accept either): 0 = attend, the dtype's minimum = blocked. Finite, so fully
masked padding rows stay finite (their outputs are never read).
"""
from __future__ import annotations

import torch

from megatron_biglm.objective.split_rule import checked_split, visible


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[b, 1, q, k]`` float mask from a bool ``[b, q, k]`` (True = may attend): 0 where
    allowed, the dtype's minimum elsewhere."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    blocked = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, blocked)[:, None]


def additive_split_mask(split: torch.Tensor, seq_len: int, *,
                        attention_mask: torch.Tensor | None = None,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[b, 1, s, s]`` additive ``dtype`` mask for a batch of splits.

    ``attention_mask`` ``[b, s]`` (1 = real token, any padding side) marks the real keys; the
    mask is built on its device (else on ``split``'s).
    """
    split, _ = checked_split(split, seq_len)
    if attention_mask is not None and tuple(attention_mask.shape) != (split.shape[0], seq_len):
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} does not match "
                         f"[batch={split.shape[0]}, seq={seq_len}]")
    device = attention_mask.device if attention_mask is not None else split.device
    split = split.to(device)
    key_real = None if attention_mask is None else (attention_mask != 0)[:, None, :]
    pos = torch.arange(seq_len, device=device)
    allowed = visible(pos.view(1, seq_len, 1), pos.view(1, 1, seq_len), split.view(-1, 1, 1),
                      key_real=key_real)
    return additive_mask(allowed, dtype)
