"""The one TorchFunctionMode that carries the argument-rewriting CPU shims.

Why one mode: each entered mode costs a Python hop per torch op, so cpu_device_mode and
cpu_tensor_type register handlers here instead of stacking two modes. The mode is entered
once, for the calling thread (torch keeps the mode stack per thread; autograd's backward
inherits it), and stays entered for the life of the process.
"""
from __future__ import annotations

from typing import Any, Callable, Dict

from torch.overrides import TorchFunctionMode

# func -> handler(func, args, kwargs) for torch functions / Tensor methods.
METHOD_REWRITES: Dict[Any, Callable[[Any, tuple, dict], Any]] = {}
# Set by cpu_device_mode: rewrites keyword arguments (device=, pin_memory=) of every op.
KWARG_REWRITER: list = []


class CpuShimMode(TorchFunctionMode):
    """Dispatches registered Tensor-method handlers and the keyword rewriter."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        handler = METHOD_REWRITES.get(func)
        if handler is not None:
            return handler(func, args, kwargs or {})
        if kwargs:
            if KWARG_REWRITER:
                kwargs = KWARG_REWRITER[0](kwargs)
            return func(*args, **kwargs)
        return func(*args)


_ENTERED: list = []


def ensure_entered() -> CpuShimMode:
    """Enter the shared mode once; later calls return the same mode."""
    if not _ENTERED:
        mode = CpuShimMode()
        mode.__enter__()
        _ENTERED.append(mode)
    return _ENTERED[0]
