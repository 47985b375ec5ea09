"""Blend specs and split checks for megatron-core's BlendedMegatronDatasetBuilder.

Two jobs that must happen *before* megatron sees the config:

* :func:`parse_blend` turns the run config's blend (``[[weight, prefix], ...]``, bare prefixes
  for equal weights, or ``{prefix: weight}``) into megatron's ``(prefixes, weights)`` and
  checks every ``prefix.bin``/``prefix.idx`` exists.
* :func:`check_splits_nonempty`: megatron-core loops forever in ``GPTDataset._get_num_epochs``
  when a split it builds holds no tokens (e.g. split "98,1,1" over 10 documents leaves valid
  empty). We compute the same per-split document ranges and fail with the numbers instead.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

SPLIT_NAMES = ("train", "valid", "test")


def parse_blend(spec: Any, what: str = "data.blend") -> tuple[list[str], list[float] | None]:
    """(prefixes, weights), weights None for a single corpus (megatron then skips blending)."""
    if not spec:
        raise ValueError(f"{what} is empty: give [[weight, path_prefix], ...] or a list of path prefixes")
    if isinstance(spec, str):
        spec = [spec]
    if isinstance(spec, dict):
        pairs = [(w, p) for p, w in spec.items()]
    elif all(isinstance(item, (str, os.PathLike)) for item in spec):
        pairs = [(1.0, p) for p in spec]
    elif all(isinstance(item, (list, tuple)) and len(item) == 2 for item in spec):
        pairs = [tuple(item) for item in spec]
    else:
        raise ValueError(
            f"{what}={spec!r} is not a blend: use [[weight, path_prefix], ...], "
            "[path_prefix, ...] (equal weights) or {path_prefix: weight}"
        )
    prefixes, weights = [], []
    for weight, prefix in pairs:
        try:
            weight = float(weight)
        except (TypeError, ValueError):
            raise ValueError(f"{what}: weight {weight!r} of {prefix!r} is not a number") from None
        if not weight > 0:
            raise ValueError(f"{what}: weight of {prefix!r} is {weight}; weights must be > 0 (drop the corpus instead)")
        prefixes.append(os.fspath(prefix))
        weights.append(weight)
    missing = [p for p in prefixes if not (os.path.isfile(p + ".bin") and os.path.isfile(p + ".idx"))]
    if missing:
        raise FileNotFoundError(
            f"{what}: no indexed dataset at {missing} (need PREFIX.bin and PREFIX.idx; "
            "a prefix is the path without the extension, as written by the preprocessing tool)"
        )
    if len(set(prefixes)) != len(prefixes):
        raise ValueError(f"{what} lists a corpus twice: {prefixes}; merge the weights")
    return prefixes, (None if len(prefixes) == 1 else weights)


def split_ranges(split_matrix: Sequence, num_sequences: int) -> list[tuple[int, int] | None]:
    """Per split, the [begin, end) sequence range megatron's builder assigns (same rounding)."""
    ranges = []
    for bookends in split_matrix:
        if bookends is None:
            ranges.append(None)
        else:
            ranges.append((int(round(bookends[0] * num_sequences)), int(round(bookends[1] * num_sequences))))
    return ranges


def check_splits_nonempty(prefixes: Sequence[str], split_matrix: Sequence, split_text: str) -> None:
    """Raise ValueError naming the corpus and split when a split megatron would build is empty."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset  # lazy: start-up (megatron.core: 2.9 CPU s)

    problems = []
    for prefix in prefixes:
        indexed = IndexedDataset(prefix)  # must outlive `lengths`, a view of its mmap
        lengths = indexed.sequence_lengths
        for name, rng in zip(SPLIT_NAMES, split_ranges(split_matrix, len(lengths))):
            if rng is None:
                continue
            n_docs = rng[1] - rng[0]
            n_tokens = int(np.sum(lengths[rng[0]:rng[1]], dtype=np.int64))
            if n_tokens == 0:
                problems.append(f"{name} gets {n_docs} of {len(lengths)} documents ({n_tokens} tokens) of {prefix}")
    if problems:
        raise ValueError(
            f"split {split_text!r} leaves a split empty: " + "; ".join(problems)
            + ". Use more documents, or give that split weight 0 and request no samples from it "
            "(megatron-core would hang building an empty split)"
        )
