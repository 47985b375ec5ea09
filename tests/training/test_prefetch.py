"""The batch read-ahead: same batches in the same order, the loader's error at the batch it
would have returned, pinning of every tensor in a batch, and a thread that `close` ends."""
from __future__ import annotations

import pytest
import torch

from megatron_biglm.training.prefetch import Prefetched, pinned


def _source(n: int, fail_at: int | None = None):
    for i in range(n):
        if i == fail_at:
            raise RuntimeError(f"the training set ran out at batch {i}")
        yield {"tokens": torch.full((2, 3), i), "split": torch.tensor([i, 0]), "name": f"b{i}"}


def test_prefetch_keeps_order_and_values():
    got = list(Prefetched(_source(7), depth=3, pin=False))
    want = list(_source(7))
    assert [b["name"] for b in got] == [b["name"] for b in want]
    assert all(torch.equal(g["tokens"], w["tokens"]) for g, w in zip(got, want))


def test_prefetch_raises_the_loader_error_where_the_loader_did():
    it = Prefetched(_source(10, fail_at=4), depth=2, pin=False)
    assert [next(it)["name"] for _ in range(4)] == ["b0", "b1", "b2", "b3"]
    with pytest.raises(RuntimeError, match="ran out at batch 4"):
        next(it)
    with pytest.raises(RuntimeError, match="ran out at batch 4"):  # and again, not a hang
        next(it)


def test_prefetch_close_ends_the_thread_while_the_queue_is_full():
    it = Prefetched(_source(1000), depth=1, pin=False)
    next(it)
    it.close()
    assert not it._thread.is_alive()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_pinned_pins_every_tensor_of_a_batch():
    batch = pinned({"a": torch.ones(2), "b": [torch.zeros(1), "text"], "c": (torch.ones(1),)})
    assert batch["a"].is_pinned() and batch["b"][0].is_pinned() and batch["c"][0].is_pinned()
    assert batch["b"][1] == "text"
