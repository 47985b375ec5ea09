"""Which slots go back to `<mask>` after an iteration.

The schedule is Mask-Predict's: after iteration t of T, n = floor(N * (T - t) / T) slots of a
block of N stay masked, so the last iteration leaves none. What differs between modes is which
slots are eligible and how they are ranked:
- "low_confidence": every slot is eligible (committed tokens can be revised), lowest probability
  first. Ties go to the earlier slot, so the choice is deterministic.
- "random": every slot is eligible, ranked by a uniform draw from the row's generator.
- "none" (LLaDA): only the slots predicted in this iteration are eligible, lowest probability
  first; committed slots are never re-masked.
A confidence threshold removes every slot at or above it from the eligible set, so those are
committed at once (Fast-dLLM) and the block can finish before T iterations.
"""
from __future__ import annotations

import math

import torch


def masked_after(n_slots: int, steps: int, t: int) -> int:
    """How many of `n_slots` stay masked after iteration `t` of `steps` (1-based)."""
    return n_slots * (steps - t) // steps


def select(logconf: torch.Tensor, eligible: torch.Tensor, counts: torch.Tensor, mode: str,
           widths: list[int], generators: list[torch.Generator | None] | None,
           threshold: float | None) -> torch.Tensor:
    """Bool `[b, w]`: the slots to re-mask.

    `logconf [b, w]` log-probabilities of the current tokens, `eligible [b, w]` the slots that
    may be re-masked before the threshold applies, `counts [b]` how many to re-mask per row
    (clamped to what is eligible)."""
    if threshold is not None:
        eligible = eligible & (logconf < math.log(threshold))
    if mode == "random":
        key = torch.ones_like(logconf)
        for r, width in enumerate(widths):
            gen = generators[r] if generators is not None else None
            key[r, :width] = torch.rand(width, generator=gen, dtype=logconf.dtype, device=logconf.device)
    else:
        key = logconf
    key = key.masked_fill(~eligible, float("inf"))
    order = key.argsort(dim=-1, stable=True)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(
        order.shape[-1], device=order.device).expand_as(order).contiguous())
    counts = torch.minimum(counts.to(rank.device), eligible.sum(dim=-1))
    return (rank < counts[:, None]) & eligible
