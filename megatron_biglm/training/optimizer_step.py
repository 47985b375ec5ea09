"""megatron's optimizer step without a host read: norm, clipping and the skip on the device.

megatron-core's `optimizer.step()` reads the gradient norm on the host when it clips (and,
without Apex or Transformer Engine, its fallback norm kernel reads every parameter's norm on
the host); the non-finite guard read the loss there too. Here the step is megatron's own
pieces, in megatron's order, over its public methods:

    prepare_grads()                      model grads -> main grads (megatron)
    norm of the grads megatron counts (common/mcore_internals.grads_for_grad_norm), summed over
                                         get_grad_stats_parallel_group()
    clip by min(1, clip_grad / (norm + 1e-6))   (megatron's coefficient, applied on the device)
    found_inf = guard.observe(iteration, loss, norm)       non-finite loss or gradient: skip the update
    step_with_ready_grads()              torch's fused Adam, which skips on found_inf

An optimizer this cannot drive (not torch's Adam/AdamW inside, a precision-aware optimizer,
a loss scaler that reads found-inf on the host anyway) returns None from
`device_skipping_optimizers`, and the caller runs megatron's `step()` with the guard on the host.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from megatron_biglm.common.mcore_internals import grads_for_grad_norm

_FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _parts(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", None) or [optimizer])


def device_skipping_optimizers(optimizer) -> list | None:
    """The torch optimizers inside megatron's `optimizer`, switched to torch's fused Adam so
    they take a `found_inf` flag and skip their update on the device; None when this module
    cannot drive the step.

    Fused Adam keeps its step count on the parameter's device; counts saved by the unfused
    optimizer (on the host) are moved there, so older checkpoints resume."""
    parts = _parts(optimizer)
    inner = [getattr(o, "optimizer", None) for o in parts]
    if not all(type(o) in (torch.optim.Adam, torch.optim.AdamW) for o in inner):
        return None
    for part in parts:
        cfg = getattr(part, "config", None)
        if cfg is None or getattr(cfg, "use_precision_aware_optimizer", False) or \
                getattr(part, "grad_scaler", None) is not None:
            return None
    for opt in inner:
        for group in opt.param_groups:
            if group.get("fused"):
                continue
            if any(p.dtype not in _FUSED_DTYPES or p.device.type not in ("cuda", "cpu") for p in group["params"]):
                return None
            group.update(fused=True, foreach=False, capturable=False, differentiable=False)
            for p in group["params"]:
                state = opt.state.get(p)
                if state and "step" in state:
                    state["step"] = torch.as_tensor(state["step"], dtype=torch.float32).to(p.device)
        opt.defaults.update(fused=True, foreach=False)
        opt._step_supports_amp_scaling = True
    return inner


def grad_norm(optimizer, device) -> torch.Tensor:
    """The global L2 norm of the main gradients (0-d float32 on `device`), as megatron counts it:
    each part's norm gradients (`grads_for_grad_norm`: shared and duplicated parameters once),
    squared and summed over the part's grad-stats group."""
    total = torch.zeros((), dtype=torch.float32, device=device)
    for part in _parts(optimizer):
        grads = grads_for_grad_norm(part)
        squares = torch.zeros(1, dtype=torch.float32, device=device)
        if grads:
            norms = torch._foreach_norm(grads)
            squares = torch.stack([n.float() for n in norms]).square().sum().reshape(1)
        group = part.get_grad_stats_parallel_group()
        if dist.is_initialized() and dist.get_world_size(group) > 1:
            dist.all_reduce(squares, group=group)
        total = total + squares[0]
    return total.sqrt()


def _clip(optimizer, norm: torch.Tensor, clip_grad: float) -> None:
    coeff = (clip_grad / (norm + 1.0e-6)).clamp(max=1.0)
    for part in _parts(optimizer):
        grads = [p.grad for p in part.get_parameters() if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, coeff.to(grads[0].device))


def device_step(optimizer, inner: list, guard, loss: torch.Tensor, iteration: int, device) -> torch.Tensor:
    """One update with no host read; returns the gradient norm (a 0-d device tensor).
    A step whose loss or gradient norm is not finite changes no parameter and no optimizer
    state (fused Adam's found_inf), and the guard counts it."""
    if optimizer.prepare_grads():  # True only with a loss scaler, which device_skipping_optimizers refuses
        raise RuntimeError("megatron's optimizer found inf in a step driven on the device")
    norm = grad_norm(optimizer, device)
    clip_grad = _parts(optimizer)[0].config.clip_grad
    if clip_grad > 0:
        _clip(optimizer, norm, clip_grad)
    found_inf = guard.observe(iteration, loss, norm)
    for opt in inner:
        opt.found_inf = found_inf
    try:
        optimizer.step_with_ready_grads()
    finally:
        for opt in inner:
            opt.found_inf = None
    return norm
