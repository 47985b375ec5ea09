"""CPU shim: every CUDA placement goes to the CPU (via the shared TorchFunctionMode).

Failure fixed: ``AssertionError: Torch not compiled with CUDA enabled`` from hard-coded CUDA
placements in megatron-core: ``device="cuda"`` for ``total_num_tokens`` in
``pipeline_parallel.schedules.forward_backward_*``, ``device='cuda'`` buffers in
``optimizer.optimizer`` (``MixedPrecisionOptimizer``/``FP32Optimizer.__init__``) and
``optimizer.clip_grads``, ``transformer.utils`` causal-mask helpers and
``tensor_parallel.data.broadcast_data``, ``.cuda()`` in ``tensor_parallel.data`` and
``LanguageModule`` embedding sync; and ``RuntimeError: pin_memory=True requires a CUDA or
other accelerator backend``. Seen in megatron-core 0.16.1.

Why a mode and not per-call-site patches: the call sites move between releases; a mode
catches all of them. It only rewrites placement arguments, so it changes no numbers.
"""
from __future__ import annotations

from typing import Any

import torch

from . import _function_mode
from ._patching import Patch

NAME = "cpu_device_mode"


def is_cuda_device(device: Any) -> bool:
    """True for "cuda", "cuda:1", torch.device("cuda", 0) and bare ints (CUDA ordinals)."""
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


def _cpu_if_cuda(value: Any) -> Any:
    return "cpu" if is_cuda_device(value) else value


def rewrite_kwargs(kwargs: dict) -> dict:
    """device=<cuda> -> "cpu"; pin_memory=True -> False (no pinned allocator without CUDA)."""
    device = kwargs.get("device")
    if device is not None and is_cuda_device(device):
        kwargs = dict(kwargs, device="cpu")
    if kwargs.get("pin_memory"):
        kwargs = dict(kwargs, pin_memory=False)
    return kwargs


def _tensor_cuda(func, args, kwargs):
    """``t.cuda(...)`` on CPU: the tensor already lives where it can live."""
    return args[0]


def _tensor_to(func, args, kwargs):
    """``t.to("cuda"|0|torch.device("cuda"), ...)``: rewrite the device argument only."""
    if len(args) > 1 and not isinstance(args[1], (torch.dtype, torch.Tensor)):
        args = (args[0], _cpu_if_cuda(args[1])) + tuple(args[2:])
    return func(*args, **rewrite_kwargs(kwargs))


def _tensor_pin_memory(func, args, kwargs):
    """Pinned memory only exists with an accelerator; plain CPU memory is equivalent here."""
    return args[0]


def apply() -> bool:
    _function_mode.METHOD_REWRITES[torch.Tensor.cuda] = _tensor_cuda
    _function_mode.METHOD_REWRITES[torch.Tensor.to] = _tensor_to
    _function_mode.METHOD_REWRITES[torch.Tensor.pin_memory] = _tensor_pin_memory
    if not _function_mode.KWARG_REWRITER:
        _function_mode.KWARG_REWRITER.append(rewrite_kwargs)
    _function_mode.ensure_entered()
    return True


PATCH = Patch(NAME, 'device="cuda" / .cuda() / .to("cuda") -> Torch not compiled with CUDA', apply)
