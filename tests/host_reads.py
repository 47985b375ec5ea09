"""Counting host reads of computed tensors: the CPU stand-in for CUDA's sync debug mode.

On a GPU, reading a value the device computed makes the host wait for the device: `.item()`,
`.tolist()`, `bool(t)` / `int(t)` / `float(t)` (so `if t.any():`), `torch.equal`, a blocking
copy to the host (`.cpu()`, `.numpy()`), and every op whose output shape depends on the data
(`nonzero`, boolean-mask indexing, `masked_select`, `unique`, ...). On CPU nothing waits, so
`HostReads` records those reads instead: a TorchFunctionMode that tells computed tensors from
host-provided ones by provenance, as a GPU run would place them.

Host-provided: a tensor the mode never saw made (the loader's batches, made on its read-ahead
thread), one made by a factory without `device=` (`torch.tensor(values)`, `arange(n)`: on a
GPU machine those are CPU tensors too), and what is computed from those alone. Computed: a
parameter, a factory's tensor made with `device=` (as the model's code makes them), a tensor
moved with `.to(device)` / `.cuda()`, and whatever is computed from a computed tensor. A read
of a computed tensor is recorded with the innermost project frame. (Gradients are made by
autograd, which the mode does not see; what the loop computes from them is built on buffers
made with `device=`.)
"""
from __future__ import annotations

import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

#: reads of a value into Python (the host waits for it)
VALUE_READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__complex__", "numpy", "cpu",
               "equal", "allclose", "is_nonzero"}
#: ops whose output shape depends on the data (the host waits to size the output)
DATA_DEPENDENT = {"nonzero", "nonzero_static", "argwhere", "masked_select", "unique", "unique_consecutive",
                  "bincount"}
#: indexing ops, data dependent when an index is a boolean mask
INDEXING = {"__getitem__", "__setitem__", "index_put", "index_put_"}
#: ops that move a tensor to a device (its result is the device's)
MOVES = {"to", "cuda"}
#: reductions whose truth value, read in Python, is named after them (`if t.any():`)
TRUTH_OPS = {"any", "all"}


def _name(func) -> str:
    return getattr(func, "__name__", str(func))


def _bool_index(obj) -> bool:
    return any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in tree_flatten(obj)[0])


def _moves_to_device(name: str, args, kwargs) -> bool:
    """`.cuda(...)`, or `.to(...)` with a device (not a dtype alone)."""
    if name == "cuda":
        return True
    if "device" in kwargs:
        return kwargs["device"] is not None
    for a in args[1:]:
        if isinstance(a, (str, torch.device)):
            return True
        if isinstance(a, torch.Tensor):  # `.to(other)`: the other's device
            return True
    return False


class HostReads(TorchFunctionMode):
    """`reads`: (op name, the innermost project frame) for each read of a computed tensor."""

    def __init__(self):
        super().__init__()
        self.reads: list[tuple[str, str]] = []
        self._computed = WeakIdKeyDictionary()  # tensor -> the op that made it

    def is_computed(self, t: torch.Tensor) -> bool:
        return isinstance(t, torch.nn.Parameter) or t in self._computed

    def _record(self, name: str) -> None:
        self.reads.append((name, _caller()))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        computed_in = any(self.is_computed(t) for t in inputs)
        if computed_in:
            if name in VALUE_READS or name in DATA_DEPENDENT:
                made_by = self._computed.get(inputs[0]) if name == "__bool__" else None
                self._record(f"{made_by}().__bool__" if made_by in TRUTH_OPS else name)
            elif name in INDEXING and len(args) > 1 and _bool_index(args[1]):
                self._record(f"{name}[bool mask]")
            elif name == "repeat_interleave" and isinstance(kwargs.get("repeats", args[1:2] and args[1]), torch.Tensor):
                self._record(name)  # tensor repeats: the output length is their sum
        out = func(*args, **kwargs)
        if name == "__setitem__" or (name.endswith("_") and not name.startswith("__")):
            return out  # in place: the target keeps its provenance
        if computed_in:
            computed_out = True
        elif not inputs:
            computed_out = kwargs.get("device") is not None
        else:
            computed_out = name in MOVES and _moves_to_device(name, args, kwargs) or kwargs.get("device") is not None
        if computed_out:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and not any(t is i for i in inputs):
                    self._computed[t] = name
            if name in MOVES and any(out is i for i in inputs):
                # `.to(device)` of a tensor already there returns it; on a GPU it would be a copy
                out = out.view_as(out)
                self._computed[out] = name
        return out


def _caller() -> str:
    for frame in reversed(traceback.extract_stack()[:-3]):
        if "megatron_biglm" in frame.filename:
            return f"{frame.filename.split('megatron_biglm/')[-1]}:{frame.lineno} {frame.line}"
    return "?"
