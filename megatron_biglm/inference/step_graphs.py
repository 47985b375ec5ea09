"""The cached block step over the slot pool, captured as one CUDA graph per shape.

Why: a cached Mask-Predict step runs the model over a block of ~32 rows per request; on a GPU
it is bound by kernel launches (a few hundred per forward), not by the model's work. A CUDA
graph replays the whole forward and head in one launch. A graph fixes every shape and every
address, so the step runs through `kv_pool.FixedShapePoolForward` (shapes depend only on the
rows and the block width; the slots' lengths are a device input) and the inputs are copied
into static tensors before each replay.

The keys a step attends to are bounded by the slots' longest length plus the width, rounded
up to `KEY_BUCKET` positions: attention stays near the work the eager step does, and one graph
serves every block whose bound rounds alike. One graph per (first slot, rows, width, logit
positions, key bound) and per pool buffers: a pool that grows gets new buffers, and the graphs of the old ones are dropped. A step whose rows are not
consecutive slots (rows gathered or repeated) runs eagerly. CUDA only; the warm-up and the
capture run on the first call of a shape with that call's own inputs, so their key/value
writes land where the step writes anyway (the open block's positions, never committed).
"""
from __future__ import annotations

from typing import Callable

import torch

from megatron_biglm.model.kv_pool import FixedShapePoolForward, KVSlotPool, on_device

WARMUP_RUNS = 2
KEY_BUCKET = 256


class CapturedStep:
    """One shape's graph: static inputs, the captured forward and head, the static output."""

    def __init__(self, run: Callable, pool: KVSlotPool, first: int, keys: int, ids, lengths, base: list[int],
                 positions):
        dev = pool.device
        self.ids, self.lengths, self.positions = ids.clone(), lengths.clone(), positions.clone()
        self.base = on_device(base, dev)

        def step():
            return run(self.ids, self.lengths, self.positions,
                       FixedShapePoolForward(pool, first, ids.shape[0], self.base, keys))

        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):  # lazy initialisations happen outside the capture
                step()
        torch.cuda.current_stream(dev).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = step()

    def __call__(self, ids, lengths, base: list[int], positions) -> torch.Tensor:
        self.ids.copy_(ids, non_blocking=True)
        self.lengths.copy_(lengths, non_blocking=True)
        self.positions.copy_(positions, non_blocking=True)
        self.base.copy_(on_device(base, self.base.device), non_blocking=True)
        self.graph.replay()
        return self.out.clone()  # the next replay overwrites the static output


class StepGraphs:
    """The captured steps of one pool, by shape. `run(ids, lengths, positions, kv_cache)` is
    the adapter's forward and head."""

    def __init__(self, run: Callable):
        self.run = run
        self._steps: dict[tuple, CapturedStep] = {}
        self._buffers: tuple[int, ...] = ()

    def __call__(self, pool: KVSlotPool, slots: list[int], ids, lengths, positions) -> torch.Tensor | None:
        """The step's logits through a graph, or None when it cannot be captured (not CUDA,
        rows that are not consecutive slots, a block that would run past a slot's capacity)."""
        first, b, q = slots[0], len(slots), ids.shape[1]
        base = [pool.lengths[s] for s in slots]
        if (pool.device.type != "cuda" or slots != list(range(first, first + b))
                or max(base) + q > pool.capacity):
            return None
        buffers = tuple(t.data_ptr() for t in pool.keys[:1] + pool.values[:1])
        if buffers != self._buffers:  # the pool grew: its old buffers' graphs are stale
            self._steps.clear()
            self._buffers = buffers
        keys = min(pool.capacity, -(-(max(base) + q) // KEY_BUCKET) * KEY_BUCKET)
        key = (first, b, q, tuple(positions.shape), keys)
        step = self._steps.get(key)
        if step is None:
            step = self._steps[key] = CapturedStep(self.run, pool, first, keys, ids, lengths, base, positions)
        return step(ids, lengths, base, positions)
