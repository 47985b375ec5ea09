"""Which positions to mask: exact-count token selection and span selection.

Both select a *stochastically rounded* count, floor(ratio·m + u) with u ~ U(0, 1), of the m
eligible positions, so the realised masked fraction is an unbiased estimate of the drawn ratio
(plain rounding would bias short parts). Only eligible positions (not special tokens) are ever
selected. Everything is O(L) numpy: no Python loop over positions.
"""
from __future__ import annotations

import numpy as np


def stochastic_count(ratio: float, m: int, rng: np.random.Generator) -> int:
    """floor(ratio·m + u): E[count] = ratio·m exactly, and 0 <= count <= m."""
    return min(m, int(ratio * m + rng.random()))


def select_tokens(
    eligible: np.ndarray, ratio: float, rng: np.random.Generator, keys: np.ndarray | None = None
) -> np.ndarray:
    """Mask exactly ``stochastic_count(ratio, eligible.sum())`` eligible positions, uniformly.

    Bernoulli(k/m) on uniform ``keys`` (pass a slice of a per-sample draw to save a call), then
    a few random additions or removals to reach exactly k. Every step treats positions
    exchangeably, so each k-subset is equally likely, at O(m) without a sort.
    """
    m = int(np.count_nonzero(eligible))
    k = stochastic_count(ratio, m, rng)
    if k == 0:
        return np.zeros(eligible.shape, dtype=bool)
    if k == m:
        return eligible.copy()
    if keys is None:
        keys = rng.random(eligible.shape[0])
    mask = (keys < k / m) & eligible
    excess = int(np.count_nonzero(mask)) - k
    if excess:  # |excess| ~ sqrt(k): a small uniform draw among the selected / unselected
        pool = np.flatnonzero(mask if excess > 0 else eligible & ~mask)
        mask[pool[rng.choice(pool.size, abs(excess), replace=False)]] = excess < 0
    return mask


def span_length_probs(max_ngram: int, law: str) -> np.ndarray:
    """P(span length = n) for n = 1..max_ngram: ``uniform``, or ``harmonic`` ∝ 1/n."""
    n = np.arange(1, max_ngram + 1, dtype=np.float64)
    if law == "uniform":
        p = np.ones_like(n)
    elif law == "harmonic":
        p = 1.0 / n
    else:
        raise ValueError(f"unknown span length law {law!r}; expected 'uniform' or 'harmonic'")
    return p / p.sum()


def select_spans(
    eligible: np.ndarray,
    ratio: float,
    max_ngram: int,
    rng: np.random.Generator,
    law: str = "uniform",
    keys: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mask whole spans of 1..max_ngram positions until the eligible count is reached.

    The part is tiled into consecutive spans with i.i.d. lengths from :func:`span_length_probs`
    (the last one cut at the end); spans are taken in random order until their eligible tokens
    reach the target count, and the last taken span is trimmed to hit it exactly. Special
    tokens inside a taken span stay unmasked. Adjacent taken spans touch, so contiguous masked
    runs can exceed max_ngram (at β_Y → 1 the whole suffix is one run); each *span* cannot.

    ``keys`` (uniform, one per position; drawn if not given) set the span lengths.
    Returns (mask, span_starts, span_lengths) of the taken spans, in tiling order.
    """
    m = eligible.shape[0]
    empty = np.zeros(0, dtype=np.int64)
    mask = np.zeros(m, dtype=bool)
    n_eligible = int(np.count_nonzero(eligible))
    target = stochastic_count(ratio, n_eligible, rng)
    if target == 0:
        return mask, empty, empty
    u = rng.random(m) if keys is None else keys  # floats, scaled: cheaper than rng.integers
    if law == "uniform":
        lengths = (u * max_ngram).astype(np.int64) + 1
    else:
        cdf = np.cumsum(span_length_probs(max_ngram, law))
        lengths = np.minimum(np.searchsorted(cdf, u, side="right") + 1, max_ngram)
    ends = np.cumsum(lengths)
    n_spans = int(np.searchsorted(ends, m)) + 1  # first span reaching the end of the part
    ends = ends[:n_spans]
    ends[-1] = m
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1]
    per_span = np.add.reduceat(eligible.astype(np.int32), starts)

    order = rng.permutation(n_spans)
    reached = np.cumsum(per_span[order])
    n_full = int(np.searchsorted(reached, target, side="right"))  # spans taken whole
    taken = np.zeros(n_spans, dtype=bool)
    taken[order[:n_full]] = True
    span_of_position = np.repeat(np.arange(n_spans), ends - starts)
    mask = taken[span_of_position] & eligible
    span_ends = ends.copy()
    remainder = target - (int(reached[n_full - 1]) if n_full else 0)
    if remainder > 0:  # trim the next span in order to exactly the remaining count
        s = int(order[n_full])
        first = starts[s] + np.flatnonzero(eligible[starts[s]:ends[s]])[:remainder]
        mask[first] = True
        taken[s] = True
        span_ends[s] = first[-1] + 1
    return mask, starts[taken].astype(np.int64), (span_ends - starts)[taken].astype(np.int64)
