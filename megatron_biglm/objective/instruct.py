"""Instruction-tuning masking (“Scaling Effects of Instruction Tuning” §3.1): one chat-formatted sample -> masked-LM inputs.

Every position has a role: TEMPLATE (the chat template's literal tokens and the special
tokens BOS/EOS), INPUT (the instruction and its input text) or TARGET (the answer). Then:

  * a random ``ratio`` (15 %) of the INPUT positions is masked, exactly
    ``floor(ratio * m + u)`` of the m eligible ones (unbiased, ``selection.select_tokens``);
    TEMPLATE positions and special ids are never eligible;
  * every TARGET position is masked, every time;
  * the loss covers all masked positions (input and target).

Masked positions become ``<mask>`` (no 80/10/10: the target must be predicted from nothing,
and “Scaling Effects of Instruction Tuning” follows plain MLM masking). The target is one contiguous run. The ``biglm``
variant sets the attention ``split`` at the target start, so input rows never see a target
key (``split_rule.visible``); ``mlm`` / ``no_attn`` give split 0 (full attention).
Pure numpy; randomness from ``rng`` only, so a generator seeded by (seed, sample index)
reproduces each sample alone.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from .apply import IGNORE_INDEX
from .selection import select_tokens
from .split_rule import attention_split

TEMPLATE, INPUT, TARGET = 0, 1, 2
INPUT_MASK_RATIO = 0.15


def target_span(roles: np.ndarray) -> tuple[int, int]:
    """[start, end) of the one contiguous TARGET run; ValueError when there is none or several."""
    where = np.flatnonzero(np.asarray(roles) == TARGET)
    if where.size == 0:
        raise ValueError("the sample has no TARGET position: an instruction sample needs an answer")
    start, end = int(where[0]), int(where[-1]) + 1
    if where.size != end - start:
        raise ValueError(f"the TARGET positions are not one contiguous run ({where.tolist()[:8]}...)")
    return start, end


def mask_instruction(tokens: np.ndarray, roles: np.ndarray, rng: np.random.Generator, mask_id: int, *,
                     special_ids: Iterable[int] = (), ratio: float = INPUT_MASK_RATIO,
                     variant: str = "biglm") -> dict:
    """Mask one sample. Returns ``input_ids`` int64 [L], ``labels`` int64 [L] (−100 where not
    masked), ``loss_mask`` float32 [L], ``split`` int (target start for ``biglm``, else 0),
    ``target_start`` int and ``input_masked`` int (how many INPUT positions were masked)."""
    tokens = np.asarray(tokens)
    roles = np.asarray(roles)
    if tokens.ndim != 1 or tokens.shape != roles.shape or tokens.dtype.kind not in "iu":
        raise ValueError(f"tokens (1-D integers) and roles must have one entry per position: "
                         f"shapes {tokens.shape} and {roles.shape}, dtype {tokens.dtype}")
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"input mask ratio must be in [0, 1], got {ratio}")
    start, end = target_span(roles)
    eligible = roles == INPUT
    for special in special_ids:
        eligible &= tokens != special
    eligible[start:end] = False
    masked = select_tokens(eligible, ratio, rng)
    input_masked = int(masked.sum())
    masked[start:end] = True
    tokens = tokens.astype(np.int64, copy=False)
    return {
        "input_ids": np.where(masked, mask_id, tokens),
        "labels": np.where(masked, tokens, IGNORE_INDEX),
        "loss_mask": masked.astype(np.float32),
        "split": attention_split(start, variant),
        "target_start": start,
        "input_masked": input_masked,
    }
