"""Counting host reads of computed tensors: the CPU stand-in for CUDA's sync debug mode.

On a GPU, reading a value the device computed (`.item()`, `.tolist()`, `bool(t)`, `int(t)`,
`.cpu()`, `nonzero`, a data-dependent shape) makes the host wait for the device. On CPU nothing
waits, so `HostReads` records those reads instead: a TorchFunctionMode that knows which tensors
were built from Python data on the host (`torch.tensor(values)` without a device, and what is
computed from those alone) and counts a read of any other tensor. A tensor moved with
`.to(device)` or built with `device=` counts as the device's, as it would be on a GPU.
"""
from __future__ import annotations

import traceback
import weakref

import torch
from torch.overrides import TorchFunctionMode

_READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "cpu", "numpy",
          "any_", "masked_select", "unique"}
_FACTORIES = {"tensor", "as_tensor", "from_numpy"}


def _name(func) -> str:
    return getattr(func, "__name__", str(func))


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)


class HostReads(TorchFunctionMode):
    """`reads`: (function name, the innermost project frame) for each read of a computed tensor."""

    def __init__(self):
        super().__init__()
        self.reads: list[tuple[str, str]] = []
        self._host: dict[int, weakref.ref] = {}  # id -> the tensor (ids of dead tensors are reused)

    def _is_host(self, t: torch.Tensor) -> bool:
        ref = self._host.get(id(t))
        return ref is not None and ref() is t

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        inputs = list(_tensors(args)) + list(_tensors(kwargs))
        if name in _READS and inputs and not all(self._is_host(t) for t in inputs):
            self.reads.append((name, _caller()))
        out = func(*args, **kwargs)
        on_host = ((name in _FACTORIES and kwargs.get("device") is None)
                   or (inputs and all(self._is_host(t) for t in inputs) and name != "to"
                       and kwargs.get("device") is None))
        if on_host:
            for t in _tensors(out):
                self._host[id(t)] = weakref.ref(t)
        return out


def _caller() -> str:
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "megatron_biglm" in frame.filename:
            return f"{frame.filename.split('megatron_biglm/')[-1]}:{frame.lineno} {frame.line}"
    return "?"
