"""Pool a padded batch of hidden states into one vector per sample.

Sequence classification, retrieval embeddings and length prediction all need one vector per
sample, and their batches are right-padded: positions at or past `valid_lengths[i]` hold
padding and must not leak into sample i's vector. Stated once here:

- "mean":  average over positions 0 .. valid_lengths[i]-1 (accumulated in fp32);
- "first": position 0 (the BOS / CLS position);
- "last":  position valid_lengths[i]-1 (the last real token).

`valid_lengths=None` means no padding (every sample has length s).
"""
from __future__ import annotations

from typing import Optional

import torch

POOLING_MODES = ("mean", "first", "last")


def pool_hidden(hidden: torch.Tensor, valid_lengths: Optional[torch.Tensor],
                mode: str = "mean") -> torch.Tensor:
    """hidden [b, s, h] (batch first), valid_lengths [b] in 1..s or None -> [b, h], hidden's dtype.

    `valid_lengths` may sit on the host (the batch as the loader gives it): it is range-checked
    where it is, free of a device sync there, then moved to hidden's device once."""
    if mode not in POOLING_MODES:
        raise ValueError(f"pooling mode must be one of {POOLING_MODES}, got {mode!r}")
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be [batch, seq, hidden], got shape {tuple(hidden.shape)}")
    b, s, _ = hidden.shape
    if valid_lengths is None:
        valid_lengths = torch.full((b,), s, dtype=torch.long, device=hidden.device)
    valid_lengths = valid_lengths.to(dtype=torch.long)
    if valid_lengths.shape != (b,):
        raise ValueError(f"valid_lengths must be [batch] = [{b}], got {tuple(valid_lengths.shape)}")
    if bool(((valid_lengths < 1) | (valid_lengths > s)).any()):
        raise ValueError(f"valid_lengths must lie in 1..{s} (an empty sample has nothing to pool), "
                         f"got {valid_lengths.tolist()}")
    valid_lengths = valid_lengths.to(device=hidden.device)
    if mode == "first":
        return hidden[:, 0]
    if mode == "last":
        return hidden[torch.arange(b, device=hidden.device), valid_lengths - 1]
    keep = torch.arange(s, device=hidden.device)[None, :] < valid_lengths[:, None]  # [b, s]
    # where, not a product: padding may hold anything (inf * 0 would be nan)
    summed = torch.where(keep[..., None], hidden.float(), 0.0).sum(dim=1)
    return (summed / valid_lengths[:, None].float()).to(hidden.dtype)
