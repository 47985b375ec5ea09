"""CPU shim: `torch.cuda.current_device()` returns "cpu".

Failure fixed: ``AssertionError: Torch not compiled with CUDA enabled`` raised from
``torch.cuda.current_device()``, which megatron-core uses as the device of freshly allocated
tensors: RoPE's ``RotaryEmbedding`` (inv_freq / ``get_emb``), ``GlobalMemoryBuffer``,
tensor-parallel gathers (``mappings._gather_along_*``), pipeline p2p shape exchange and the
DDP grad buffers. Seen in megatron-core 0.16.1.

Returning the string "cpu" (not an int) keeps every ``device=torch.cuda.current_device()``
allocation valid on CPU without any other shim.
"""
from __future__ import annotations

import torch

from ._patching import Patch, replace_attr

NAME = "cpu_current_device"


def _current_device_cpu() -> str:
    """Stand-in for torch.cuda.current_device on a CPU-only process."""
    return "cpu"


def apply() -> bool:
    return replace_attr(torch.cuda, "current_device", lambda _orig: _current_device_cpu, NAME)


PATCH = Patch(NAME, "torch.cuda.current_device() -> Torch not compiled with CUDA enabled", apply)
