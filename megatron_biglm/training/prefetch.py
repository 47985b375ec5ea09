"""Batches read ahead of the step that needs them, so the device never waits on the loader.

A background thread pulls from the loader's iterator `depth` batches ahead. On CUDA it also
pins each batch's tensors (page-locked host memory), so the recipe's
`.to(device, non_blocking=True)` copies are real asynchronous copies that overlap the
previous step's kernels instead of stalling the stream. Batches come out in the loader's
order, and an error the loader raised (the training set ran out, say) comes out at the
`next()` that would have returned that batch. Samples are pure functions of their index, so
reading them earlier changes no number.
"""
from __future__ import annotations

import queue
import threading

import torch

_END = object()


def pinned(batch):
    """`batch` with every CPU tensor in it (dicts, lists, tuples) in pinned memory."""
    if torch.is_tensor(batch):
        return batch.pin_memory() if batch.device.type == "cpu" else batch
    if isinstance(batch, dict):
        return {k: pinned(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(pinned(v) for v in batch)
    return batch


class Prefetched:
    """An iterator over `source`, read `depth` items ahead in a daemon thread (`close` ends it)."""

    def __init__(self, source, depth: int = 2, pin: bool | None = None):
        self.pin = torch.cuda.is_available() if pin is None else pin
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, args=(iter(source),), daemon=True,
                                        name="batch-prefetch")
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self, source) -> None:
        while not self._stop.is_set():
            try:
                item = next(source)
            except StopIteration:
                self._put((_END, None))
                return
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
                self._put((_END, exc))
                return
            if not self._put((pinned(item) if self.pin else item, None)):
                return

    def __iter__(self):
        return self

    def __next__(self):
        item, error = self._queue.get()
        if item is _END:
            self._queue.put((_END, error))  # every later next() ends the same way
            if error is not None:
                raise error
            raise StopIteration
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
