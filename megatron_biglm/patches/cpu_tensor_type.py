"""CPU shim: ``tensor.type()`` reports the CUDA type string for CPU tensors.

Failure fixed: ``AssertionError`` at ``assert param.grad.type() == 'torch.cuda.FloatTensor'``
in ``optimizer.clip_grads.clip_grad_by_total_norm_fp32``, and ``TypeError: Wrapped
parameters must be one of torch.cuda.FloatTensor, torch.cuda.HalfTensor, or
torch.cuda.BFloat16Tensor. Received torch.FloatTensor`` from
``DistributedOptimizer._build_model_and_main_param_groups`` and
``Float16OptimizerWithFloat16Params``. Seen in megatron-core 0.16.1.

Why report rather than patch each assert: the checks are inline in long methods that move
between releases. Conversions such as ``t.type('torch.cuda.HalfTensor')`` are mapped to
the CPU type. A handler in the shared mode (_function_mode), independent of cpu_device_mode.
"""
from __future__ import annotations

import torch

from . import _function_mode
from ._patching import Patch

NAME = "cpu_tensor_type"


def _tensor_type(func, args, kwargs):
    tensor = args[0]
    dtype = args[1] if len(args) > 1 else kwargs.get("dtype")
    if dtype is None:
        name = func(tensor)
        if tensor.device.type == "cpu" and name.startswith("torch.") and ".cuda." not in name:
            return "torch.cuda." + name[len("torch."):]
        return name
    if isinstance(dtype, str):
        dtype = dtype.replace("torch.cuda.", "torch.")
    elif isinstance(dtype, type) and dtype.__module__ == "torch.cuda":
        dtype = getattr(torch, dtype.__name__)
    rest = {k: v for k, v in kwargs.items() if k != "dtype"}
    return func(tensor, dtype, *args[2:], **rest)


def apply() -> bool:
    _function_mode.METHOD_REWRITES[torch.Tensor.type] = _tensor_type
    _function_mode.ensure_entered()
    return True


PATCH = Patch(NAME, "param.grad.type() == 'torch.cuda.FloatTensor' asserts fail on CPU", apply)
