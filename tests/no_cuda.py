"""The failure a CUDA call raises on a machine without a GPU, whichever torch build is installed."""
from __future__ import annotations

import torch


def torch_no_cuda_errors() -> set:
    """(type, first line) of what this torch build raises for CUDA calls on a machine without a
    GPU: the CPU build's AssertionError ("Torch not compiled with CUDA enabled"), the CUDA
    build's RuntimeError ("Found no NVIDIA driver ...") or AcceleratorError, by entry point.
    The tests compare megatron's failure with this reference, whichever build is installed."""
    errors = set()
    for call in (torch.cuda.current_device, torch.cuda.get_rng_state, torch.cuda.Stream,
                 lambda: torch.cuda.Stream(device="cuda"),
                 torch.cuda.synchronize, lambda: torch.empty(1, device="cuda")):
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - collecting whatever the build raises
            errors.add((type(exc).__name__, str(exc).splitlines()[0]))
    return errors
