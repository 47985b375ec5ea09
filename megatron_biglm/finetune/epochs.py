"""Epochs for every fine-tuning recipe: the one rule that turns epochs into steps, and the one
order that draws each epoch.

    steps_per_epoch = ceil(examples / global_batch)      (rounded UP)
    train_steps     = max(ceil(epochs * steps_per_epoch), min_steps, 1)

An epoch is `steps_per_epoch * global_batch` global samples: a fresh permutation of the examples
(seeded by the run's `data.seed` and the epoch number), whose last step tops up with the first
examples of that same permutation. `EpochOrder` maps a global sample index to its example as a
pure function of the index, so a run resumed at `consumed_samples` draws exactly what an
uninterrupted run draws, whatever the data-parallel layout.
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np
import torch


def steps_per_epoch(examples: int, global_batch: int) -> int:
    if examples < 1 or global_batch < 1:
        raise ValueError(f"an epoch needs examples >= 1 and a global batch >= 1, got {examples} and {global_batch}")
    return math.ceil(examples / global_batch)


def train_steps(examples: int, epochs: float, global_batch: int, min_steps: int = 0) -> int:
    """The optimizer steps of `epochs` epochs (fractional epochs round up to whole steps)."""
    if epochs <= 0:
        raise ValueError(f"epochs must be > 0, got {epochs}")
    return max(math.ceil(epochs * steps_per_epoch(examples, global_batch)), int(min_steps), 1)


class EpochOrder:
    """Global sample index -> example index (see the module doc). `stream` keys a recipe's
    permutations apart from other seeded streams of the same run."""

    def __init__(self, examples: int, global_batch: int, seed: int, stream: Sequence[int] = ()):
        self.examples = int(examples)
        self.per_epoch = steps_per_epoch(self.examples, global_batch) * int(global_batch)
        self.seed, self.stream = int(seed), tuple(int(s) for s in stream)

    @functools.lru_cache(maxsize=4)  # noqa: B019 - a few epochs' permutations, per order
    def permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, *self.stream, epoch]).permutation(self.examples)

    def __call__(self, i: int) -> int:
        epoch, within = divmod(int(i), self.per_epoch)
        return int(self.permutation(epoch)[within % self.examples])

    def epoch_of(self, i: int) -> int:
        return int(i) // self.per_epoch


class EpochSamples(torch.utils.data.Dataset):
    """`total` samples drawn epoch by epoch from `examples` by an `EpochOrder`."""

    def __init__(self, examples: Sequence, global_batch: int, total: int, seed: int):
        if not examples:
            raise ValueError("no training examples left after the checks (see the row report above)")
        self.examples, self.total = list(examples), int(total)
        self.order = EpochOrder(len(self.examples), global_batch, seed)

    def __len__(self) -> int:
        return self.total

    def __getitem__(self, i: int):
        return self.examples[self.order(i)]
