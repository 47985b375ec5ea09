"""megatron-core's `RowParallelLinear.forward` hands its matmul `tp_group=None` (seen in 0.16.1
and 0.19.2), so `linear_with_grad_accumulation_and_async_allreduce` asks
`get_tensor_model_parallel_group_if_none(None)`, which calls `warnings.warn("tp_group is None,
using default tp group ...")` on rank 0 on every forward of every row-parallel layer. Python
prints it once, but the call itself is what torch.compile cannot trace: each attention output
projection and MLP `linear_fc2` splits a compiled transformer layer into separate graphs (two
breaks per layer, one of them inside megatron's activation-offloading context, where dynamo
then gives up on the rest of the frame), so `model.compile_layers` cannot compile a layer as one
graph. `apply()` wraps `RowParallelLinear._forward_impl` so that a `tp_group=None` becomes the
layer's own `self.tp_group` (what the helper would have resolved for it; with the input already
parallel and no sequence parallelism the matmul only carries the group, it communicates
nothing), and passes every other call through unchanged.
"""
from __future__ import annotations

import functools

from ._patching import Patch, import_or_none, replace_attr

TARGET = "megatron.core.tensor_parallel.layers"
NAME = "row_linear_tp_group"


def _with_own_group(original):
    @functools.wraps(original)
    def _forward_impl(self, input, weight, *args, **kwargs):
        if "tp_group" in kwargs and kwargs["tp_group"] is None and getattr(self, "tp_group", None) is not None:
            kwargs["tp_group"] = self.tp_group
        return original(self, input, weight, *args, **kwargs)

    return _forward_impl


def _apply() -> bool:
    layers = import_or_none(TARGET)
    if layers is None or not hasattr(layers, "RowParallelLinear"):
        return False
    return replace_attr(layers.RowParallelLinear, "_forward_impl", _with_own_group, NAME)


PATCH = Patch(name=NAME, fixes=__doc__.split("\n\n")[0], apply=_apply)
