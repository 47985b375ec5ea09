"""CPU shim: `torch.cuda.synchronize()` is a no-op.

Failure fixed: ``AssertionError: Torch not compiled with CUDA enabled`` from
``torch.cuda.synchronize()`` in pipeline p2p (``p2p_communication._batched_p2p_ops`` /
``_communicate`` when ``batch_p2p_sync=True``, the default), in
``DistributedDataParallel.{free,allocate}_overlap_grad_reduce`` helpers and in
``parallel_state`` timeout updates. Seen in megatron-core 0.16.1.

CPU ops are synchronous, so there is nothing to wait for.
"""
from __future__ import annotations

import torch

from ._patching import Patch, replace_attr

NAME = "cpu_synchronize"


def _synchronize_noop(device=None) -> None:
    """CPU work is already complete when an op returns."""
    return None


def apply() -> bool:
    return replace_attr(torch.cuda, "synchronize", lambda _orig: _synchronize_noop, NAME)


PATCH = Patch(NAME, "torch.cuda.synchronize() -> Torch not compiled with CUDA enabled", apply)
