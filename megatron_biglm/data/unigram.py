"""The unigram entropy of an indexed corpus: the loss of the best model that ignores context.

A masked-LM loss at or above this number means the model has learned only token frequencies
(it predicts the same distribution at every masked position). The quickstart prints it next
to its validation loss and draws it on the loss curves, so a reader sees how far below the
frequency floor the model got.
"""
from __future__ import annotations

import numpy as np

from .indexed_tools import check_dataset


def unigram_counts(prefix, vocab_size: int | None = None) -> np.ndarray:
    """How often each token id occurs in the (validated) dataset, end-of-document ids included."""
    index = check_dataset(prefix, vocab_size)
    if not index.num_tokens:
        return np.zeros(vocab_size or 0, dtype=np.int64)
    tokens = np.memmap(index.prefix + ".bin", mode="r", dtype=index.dtype)
    return np.bincount(np.asarray(tokens, dtype=np.int64), minlength=vocab_size or 0)


def unigram_entropy(prefix, vocab_size: int | None = None) -> float:
    """H = -sum_t p(t) ln p(t) in nats, p the token frequencies of the whole dataset."""
    counts = unigram_counts(prefix, vocab_size)
    total = counts.sum()
    if not total:
        raise ValueError(f"{prefix}: no tokens, so no unigram entropy")
    p = counts[counts > 0] / total
    return float(-(p * np.log(p)).sum())
