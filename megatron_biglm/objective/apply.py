"""apply_objective: one token window -> (input_ids, labels, loss_mask, split) for BiGLM.

Per sample (paper §2.1): cut the window at a split s ~ U{⌈αL⌉..⌊(1−α)L⌋} into a prefix X and a
suffix Y; draw β_Y ~ U(beta_y_range) and β_X (adaptive λ1 − λ2·β_Y, or uniform); mask a β_X
share of X's tokens and a β_Y share of Y's (tokens or spans). Special tokens (EOS/BOS/PAD) are
never masked. All randomness comes from ``rng``, so a per-sample generator seeded by
(seed, sample index) makes every sample reproducible on its own, independent of order.
"""
from __future__ import annotations

import functools
import math
from typing import Iterable

import numpy as np

from .config import ObjectiveConfig
from .selection import select_spans, select_tokens
from .split_rule import attention_split

IGNORE_INDEX = -100


def draw_split(seq_len: int, alpha: float, rng: np.random.Generator) -> int:
    """Split uniform over the integers in [ceil(α·L), floor((1−α)·L)], kept within [1, L−1]:
    prefix and suffix are never empty (the paper's i ∈ (1, L))."""
    if seq_len < 2:
        raise ValueError(f"a split needs at least 2 tokens (a prefix and a suffix), got {seq_len}")
    lo = max(1, math.ceil(alpha * seq_len - 1e-9))
    hi = min(seq_len - 1, math.floor((1.0 - alpha) * seq_len + 1e-9))
    return lo + min(hi - lo, int(rng.random() * (hi - lo + 1)))  # cheaper than rng.integers


def draw_ratios(config: ObjectiveConfig, rng: np.random.Generator) -> tuple[float, float]:
    """(β_X, β_Y) by the configured laws."""
    lo, hi = config.beta_y_range
    beta_y = lo + (hi - lo) * rng.random()
    if config.prefix_mode == "adaptive":
        beta_x = config.lambda1 - config.lambda2 * beta_y
    else:
        lo, hi = config.beta_x_range
        beta_x = lo + (hi - lo) * rng.random()
    return beta_x, beta_y


@functools.lru_cache(maxsize=16)
def _eligibility_table(special_ids: tuple[int, ...], vocab_size: int) -> np.ndarray:
    table = np.ones(vocab_size, dtype=bool)
    table[[s for s in special_ids if 0 <= s < vocab_size]] = False
    return table


def eligible_positions(
    tokens: np.ndarray, special_ids: Iterable[int], vocab_size: int | None = None
) -> np.ndarray:
    """True where a token may be masked (not EOS/BOS/PAD/...).

    With ``vocab_size`` this is one gather from a cached table (and ids outside the vocab are
    an error); without, one comparison per special id.
    """
    special_ids = tuple(special_ids)
    if vocab_size is None:
        eligible = np.ones(tokens.shape, dtype=bool)
        for special in special_ids:
            eligible &= tokens != special
        return eligible
    try:
        if tokens.dtype.kind == "i" and tokens.min() < 0:  # numpy would wrap negative ids
            raise IndexError
        return _eligibility_table(special_ids, int(vocab_size))[tokens]
    except IndexError:
        bad = tokens[(tokens < 0) | (tokens >= vocab_size)]
        raise ValueError(
            f"token ids {np.unique(bad)[:5].tolist()} lie outside [0, vocab_size={vocab_size}); "
            "the data was tokenized with a different tokenizer"
        ) from None


def _random_replacements(n, vocab_size, excluded, rng) -> np.ndarray:
    """n ids uniform over [0, vocab_size) minus ``excluded`` (no random <mask>/EOS/...)."""
    excluded = np.unique(np.asarray([e for e in excluded if 0 <= e < vocab_size], dtype=np.int64))
    allowed = vocab_size - excluded.size
    if allowed <= 0:
        raise ValueError(f"vocab_size={vocab_size} leaves no non-special token to sample")
    draw = rng.integers(0, allowed, size=n)
    # shift each draw past the excluded ids at or below it (excluded sorted, made rank-relative)
    return draw + np.searchsorted(excluded - np.arange(excluded.size), draw, side="right")


def apply_objective(
    tokens: np.ndarray,
    config: ObjectiveConfig,
    rng: np.random.Generator,
    mask_id: int,
    special_ids: Iterable[int] = (),
    vocab_size: int | None = None,
) -> dict:
    """Mask one sample. Returns a dict of numpy arrays/ints:

    ``input_ids`` int64 [L]: tokens with masked positions replaced (``<mask>``, or 80/10/10).
    ``labels`` int64 [L]: the original token where masked, −100 elsewhere.
    ``loss_mask`` float32 [L]: 1.0 where masked.
    ``split`` int: the *attention* split: the prefix length for ``biglm``; 0 for ``no_attn``
        and ``mlm``, whose attention is full (split 0 is full attention under the one rule,
        ``split_rule.visible``; no flag travels beside it).
    ``prefix_len`` int: where the masking policy changes (= split for biglm, the cut for
        ``no_attn``, 0 for ``mlm``). ``beta_x``/``beta_y``: the drawn ratios (NaN for mlm).

    At least one token is always masked: if the draws mask none, one eligible token (in the
    suffix when it has one) is masked. A window with no maskable token raises ValueError.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.size == 0 or tokens.dtype.kind not in "iu":
        raise ValueError(
            f"tokens must be a non-empty 1-D integer array, got shape {tokens.shape} dtype {tokens.dtype}"
        )
    if config.replacement == "bert" and vocab_size is None:
        raise ValueError("replacement='bert' (80/10/10) samples random tokens: pass vocab_size")
    special_ids = tuple(int(s) for s in special_ids)
    seq_len = tokens.size
    eligible = eligible_positions(tokens, special_ids, vocab_size)
    keys = rng.random(seq_len)  # one draw serves the token selection of both parts

    if config.variant == "mlm":
        cut, beta_x, beta_y = 0, float("nan"), float("nan")
        masked = select_tokens(eligible, config.mlm_ratio, rng, keys)
    else:
        cut = draw_split(seq_len, config.alpha, rng)
        beta_x, beta_y = draw_ratios(config, rng)
        masked = np.empty(seq_len, dtype=bool)
        masked[:cut] = select_tokens(eligible[:cut], beta_x, rng, keys[:cut])
        if config.suffix_unit == "span":
            masked[cut:] = select_spans(
                eligible[cut:], beta_y, config.max_ngram, rng, config.span_length_law, keys[cut:]
            )[0]
        else:
            masked[cut:] = select_tokens(eligible[cut:], beta_y, rng, keys[cut:])

    if not masked.any():
        candidates = np.flatnonzero(eligible[cut:]) + cut
        if candidates.size == 0:
            candidates = np.flatnonzero(eligible)
        if candidates.size == 0:
            raise ValueError(
                f"sample of {seq_len} tokens has no maskable token (all are special ids "
                f"{special_ids}); check the data or the special_ids passed"
            )
        masked[candidates[rng.integers(candidates.size)]] = True

    tokens = tokens.astype(np.int64, copy=False)
    labels = np.where(masked, tokens, IGNORE_INDEX)
    if config.replacement == "mask":
        input_ids = np.where(masked, mask_id, tokens)
    else:
        input_ids = tokens.copy()
        where = np.flatnonzero(masked)
        u = rng.random(where.size)
        p_mask, p_random, _ = config.bert_probs
        input_ids[where[u < p_mask]] = mask_id
        to_random = where[(u >= p_mask) & (u < p_mask + p_random)]
        input_ids[to_random] = _random_replacements(
            to_random.size, vocab_size, special_ids + (mask_id,), rng
        )
    return {
        "input_ids": input_ids,
        "labels": labels,
        "loss_mask": masked.astype(np.float32),
        "split": attention_split(cut, config.variant),
        "prefix_len": cut,
        "beta_x": beta_x,
        "beta_y": beta_y,
    }
