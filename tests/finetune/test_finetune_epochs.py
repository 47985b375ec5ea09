"""The one epoch rule and the one epoch order every fine-tuning recipe draws by."""
from __future__ import annotations

import math

import numpy as np
import pytest

from megatron_biglm.finetune.epochs import EpochOrder, EpochSamples, steps_per_epoch, train_steps


@pytest.mark.parametrize("draw", range(40))
def test_each_epoch_is_a_permutation_topped_up_from_itself(draw):
    rng = np.random.default_rng(draw)
    n, gbs, seed = int(rng.integers(1, 60)), int(rng.integers(1, 17)), int(rng.integers(0, 1000))
    order = EpochOrder(n, gbs, seed)
    per_epoch = math.ceil(n / gbs) * gbs
    assert order.per_epoch == per_epoch and per_epoch % gbs == 0 and n <= per_epoch < n + gbs
    for epoch in range(3):
        drawn = [order(epoch * per_epoch + j) for j in range(per_epoch)]
        assert sorted(drawn[:n]) == list(range(n))           # every example once...
        assert drawn[n:] == drawn[:per_epoch - n]             # ...then the same permutation's first ones
        assert {order.epoch_of(epoch * per_epoch + j) for j in range(per_epoch)} == {epoch}
    firsts = [[order(e * per_epoch + j) for j in range(n)] for e in range(3)]
    assert n < 3 or firsts[0] != firsts[1] or firsts[1] != firsts[2]  # reshuffled per epoch
    # a pure function of the index: a fresh order (a resumed run) draws the same
    again = EpochOrder(n, gbs, seed)
    for i in rng.integers(0, 5 * per_epoch, 20):
        assert again(int(i)) == order(int(i))
    assert EpochOrder(n, gbs, seed, stream=(7,)).permutation(0).tolist() != order.permutation(0).tolist() or n < 3


def test_the_rule_rounds_up_and_honours_min_steps():
    assert steps_per_epoch(100, 32) == 4 and steps_per_epoch(96, 32) == 3
    assert train_steps(100, 3, 32) == 12
    assert train_steps(100, 0.5, 32) == 2            # half of 4 steps
    assert train_steps(100, 0.1, 32) == 1            # at least one step
    assert train_steps(8, 3, 32, min_steps=300) == 300
    with pytest.raises(ValueError, match="epochs must be > 0"):
        train_steps(100, 0, 32)
    with pytest.raises(ValueError, match="examples >= 1"):
        steps_per_epoch(0, 32)


def test_epoch_samples_serve_examples_in_the_order():
    examples = [f"ex{i}" for i in range(10)]
    samples = EpochSamples(examples, 4, 24, seed=5)
    assert len(samples) == 24
    assert [samples[i] for i in range(24)] == [examples[samples.order(i)] for i in range(24)]
    with pytest.raises(ValueError, match="no training examples"):
        EpochSamples([], 4, 8, seed=0)
