"""Fixes for saving/loading megatron's DistributedOptimizer with dist_checkpointing when the
inner optimizer is torch Adam/AdamW (no apex / Transformer Engine: every CPU run, and GPU
runs without TE). Seen in megatron-core 0.16.1 and 0.19.2; with all five, a resumed run is
bit-identical to an uninterrupted one.

Applied per optimizer, through one explicit call (nothing global):

    optimizer = get_megatron_optimizer(...)
    patches.apply_distopt_checkpoint_fixes(optimizer)
    # save:  sd["optimizer"] = optimizer.sharded_state_dict(sd["model"], metadata=DISTOPT_METADATA)
    # load:  sd["optimizer"] = optimizer.sharded_state_dict(sd["model"], is_loading=True,
    #                                                      metadata=DISTOPT_METADATA)
    #        optimizer.load_state_dict(dist_checkpointing.load(sd, ckpt_dir)["optimizer"])

The five fixes, one function each (names are what `skip=` takes):
1. sharding_type:     default sharding 'fully_sharded_model_space' raises
                      "ShardedTensor.flattened_range is not supported." -> use 'dp_reshardable'.
2. init_empty_state:  sharded_state_dict(is_loading=True) on a fresh optimizer trips
                      `assert len(steps) == 1` in DistributedOptimizer.state_dict (no state yet).
3. load_no_grad:      load_state_dict raises "a view of a leaf Variable that requires grad is
                      being used in an in-place operation" (copy_ into fp32 main-param views).
4. restore_step:      the per-parameter AdamW `step` comes back as 0, not the saved step
                      (the saved value survives only in param_groups[i]["step"]).
5. unshare_step:      load_state_dict gives every parameter one shared `step` tensor, so
                      AdamW increments it once per parameter per step.
"""
from __future__ import annotations

import functools
from typing import Iterable, List, Optional

import torch

from ._patching import log

SHARDING_KEY = "distrib_optim_sharding_type"
DP_RESHARDABLE = "dp_reshardable"
# What the saver and the loader pass as `metadata=` (fix 1 also defaults to it).
DISTOPT_METADATA = {SHARDING_KEY: DP_RESHARDABLE}

FIX_NAMES = ("sharding_type", "init_empty_state", "load_no_grad", "restore_step", "unshare_step")
_APPLIED_ATTR = "_biglm_distopt_fixes"
_TORCH_ADAMS = (torch.optim.Adam, torch.optim.AdamW)


def distributed_optimizers(optimizer) -> list:
    """The DistributedOptimizer instances inside `optimizer` (itself, or a ChainedOptimizer's)."""
    chain = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return [opt for opt in chain if type(opt).__name__ == "DistributedOptimizer"]


def _torch_adams(optimizer) -> list:
    return [
        dist.optimizer for dist in distributed_optimizers(optimizer)
        if isinstance(getattr(dist, "optimizer", None), _TORCH_ADAMS)
    ]


def with_dp_reshardable(metadata: Optional[dict]) -> dict:
    """Fix 1: default the sharding type to 'dp_reshardable' (an explicit choice is kept)."""
    metadata = dict(metadata or {})
    metadata.setdefault(SHARDING_KEY, DP_RESHARDABLE)
    return metadata


def init_empty_adam_state(optimizer) -> int:
    """Fix 2: give every parameter without state the state torch Adam would create on its
    first step (step 0, zero moments), so megatron can describe/allocate it for loading.

    Same values torch initializes lazily, so a step taken afterwards is unchanged.
    Returns the number of parameters initialized."""
    count = 0
    for adam in _torch_adams(optimizer):
        for group in adam.param_groups:
            on_device = group.get("capturable", False) or group.get("fused", False)
            for param in group["params"]:
                state = adam.state[param]
                if len(state) > 0:
                    continue
                state["step"] = (
                    torch.zeros((), dtype=torch.float32, device=param.device)
                    if on_device else torch.tensor(0.0, dtype=torch.float32)
                )
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                if group.get("amsgrad", False):
                    state["max_exp_avg_sq"] = torch.zeros_like(
                        param, memory_format=torch.preserve_format
                    )
                count += 1
    return count


def unshare_adam_step(optimizer) -> int:
    """Fix 5: one `step` tensor per parameter (a clone where several share one).
    Returns the number of step tensors cloned."""
    cloned = 0
    for adam in _torch_adams(optimizer):
        seen = set()
        for group in adam.param_groups:
            for param in group["params"]:
                state = adam.state.get(param, {})
                step = state.get("step")
                if isinstance(step, torch.Tensor):
                    if id(step) in seen:
                        state["step"] = step.detach().clone()
                        cloned += 1
                    seen.add(id(state["step"]))
    return cloned


def restore_adam_step(optimizer) -> int:
    """Fix 4: set each parameter's AdamW `step` to its group's saved `step`.
    Returns the number of parameters whose step was restored."""
    restored = 0
    for adam in _torch_adams(optimizer):
        for group in adam.param_groups:
            saved = group.get("step")
            if saved is None:
                continue
            for param in group["params"]:
                step = adam.state.get(param, {}).get("step")
                if isinstance(step, torch.Tensor):
                    with torch.no_grad():
                        step.fill_(float(saved))
                    restored += 1
    return restored


def _fixed_sharded_state_dict(original, optimizer, fixes):
    @functools.wraps(original)
    def sharded_state_dict(model_sharded_state_dict=None, is_loading=False, *args, **kwargs):
        if "sharding_type" in fixes and not args and kwargs.get("sharding_type") is None:
            kwargs["metadata"] = with_dp_reshardable(kwargs.get("metadata"))
        if "init_empty_state" in fixes:
            init_empty_adam_state(optimizer)
        if model_sharded_state_dict is None:
            model_sharded_state_dict = {}
        return original(model_sharded_state_dict, is_loading, *args, **kwargs)

    return sharded_state_dict


def _fixed_load_state_dict(original, optimizer, fixes):
    @functools.wraps(original)
    def load_state_dict(state_dict):
        if "load_no_grad" in fixes:
            with torch.no_grad():
                result = original(state_dict)
        else:
            result = original(state_dict)
        if "unshare_step" in fixes:
            unshare_adam_step(optimizer)
        if "restore_step" in fixes:
            restore_adam_step(optimizer)
        return result

    return load_state_dict


def apply_distopt_checkpoint_fixes(optimizer, skip: Iterable[str] = ()) -> List[str]:
    """Install the five fixes on this megatron optimizer's sharded_state_dict/load_state_dict.

    Returns the names of the fixes installed (all of FIX_NAMES minus `skip`), or [] (logged)
    when the optimizer holds no DistributedOptimizer over torch Adam/AdamW, where none of
    them is needed. Idempotent per optimizer; `skip` exists so tests can show each failure.
    """
    skip = set(skip)
    unknown = skip.difference(FIX_NAMES)
    if unknown:
        raise ValueError(f"unknown distopt fix names {sorted(unknown)}; known: {FIX_NAMES}")
    already = getattr(optimizer, _APPLIED_ATTR, None)
    if already is not None:
        return list(already)
    if not _torch_adams(optimizer):
        log.info(
            "distopt checkpoint fixes not needed: %s holds no DistributedOptimizer over "
            "torch Adam/AdamW", type(optimizer).__name__,
        )
        return []
    fixes = tuple(name for name in FIX_NAMES if name not in skip)
    optimizer.sharded_state_dict = _fixed_sharded_state_dict(
        optimizer.sharded_state_dict, optimizer, fixes
    )
    optimizer.load_state_dict = _fixed_load_state_dict(optimizer.load_state_dict, optimizer, fixes)
    setattr(optimizer, _APPLIED_ATTR, fixes)
    return list(fixes)
