"""Fixes for saving/loading megatron's DistributedOptimizer with dist_checkpointing when the
inner optimizer is torch Adam/AdamW (no apex / Transformer Engine: every CPU run, and GPU
runs without TE). All seen in megatron-core 0.16.1 (1-5 also in 0.19.2, per the shared
notes); with them a resumed run is bit-identical to an uninterrupted one. Always pass
DISTOPT_METADATA: fix 1 is also needed with TE, where the other fixes are not installed.

Applied per optimizer, through one explicit call (nothing global):

    optimizer = get_megatron_optimizer(...)
    patches.apply_distopt_checkpoint_fixes(optimizer)
    # save:  sd["optimizer"] = optimizer.sharded_state_dict(sd["model"], metadata=DISTOPT_METADATA)
    # load:  sd["optimizer"] = optimizer.sharded_state_dict(sd["model"], is_loading=True,
    #                                                      metadata=DISTOPT_METADATA)
    #        optimizer.load_state_dict(dist_checkpointing.load(sd, ckpt_dir)["optimizer"])

Loaders that drive megatron's calls themselves can instead pass DISTOPT_METADATA, load under
torch.no_grad(), and call distopt_before_load(optimizer) before building the loading sharded
state dict and distopt_after_load(optimizer, applied_steps) after load_state_dict.

The fixes, one function each (names are what `skip=` takes):
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
6. reshardable_step:  with metadata 'fully_reshardable' (the format that can change TP/PP on
                      resume), load_state_dict raises KeyError: 'step' in
                      _set_main_param_and_optimizer_states: that format stores no per-param
                      step. The step then comes from param_groups (fix 4).
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

FIX_NAMES = (
    "sharding_type", "init_empty_state", "load_no_grad", "restore_step", "unshare_step",
    "reshardable_step",
)
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


def restore_adam_step(optimizer, step: Optional[int] = None) -> int:
    """Fix 4: set each parameter's AdamW `step` to its group's saved `step` (or to `step`).
    Returns the number of parameters whose step was set."""
    restored = 0
    for adam in _torch_adams(optimizer):
        for group in adam.param_groups:
            saved = group.get("step") if step is None else step
            if saved is None:
                continue
            for param in group["params"]:
                current = adam.state.get(param, {}).get("step")
                if isinstance(current, torch.Tensor):
                    with torch.no_grad():
                        current.fill_(float(saved))
                    restored += 1
    return restored


def distopt_before_load(optimizer) -> int:
    """Fix 2 as a plain call, for loaders that drive megatron's calls themselves."""
    return init_empty_adam_state(optimizer)


def distopt_after_load(optimizer, applied_steps: Optional[int] = None) -> int:
    """Fixes 5 then 4 as a plain call: one `step` tensor per parameter, set to
    `applied_steps` (the number of optimizer updates so far) or, if None, the saved step."""
    unshare_adam_step(optimizer)
    return restore_adam_step(optimizer, applied_steps)


def _tolerate_missing_step(distributed_optimizer) -> bool:
    """Fix 6: let DistributedOptimizer._set_main_param_and_optimizer_states accept source
    tensors without "step" (keep the current step; restore_adam_step sets it afterwards)."""
    original = getattr(distributed_optimizer, "_set_main_param_and_optimizer_states", None)
    index_map = getattr(distributed_optimizer, "model_param_group_index_map", None)
    if original is None or index_map is None:
        log.info("reshardable_step: DistributedOptimizer internals differ here: not needed")
        return False

    @functools.wraps(original)
    def set_states(model_param, tensors):
        if "step" not in tensors:
            group_index, group_order = index_map[model_param]
            adam = distributed_optimizer.optimizer
            main_param = adam.param_groups[group_index]["params"][group_order]
            step = adam.state.get(main_param, {}).get("step")
            if step is not None:
                tensors = {**tensors, "step": step}
        return original(model_param, tensors)

    distributed_optimizer._set_main_param_and_optimizer_states = set_states
    return True


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
    """Install the fixes on this megatron optimizer's sharded_state_dict/load_state_dict.

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
    if "reshardable_step" in fixes:
        for dist_opt in distributed_optimizers(optimizer):
            if isinstance(getattr(dist_opt, "optimizer", None), _TORCH_ADAMS):
                _tolerate_missing_step(dist_opt)
    optimizer.sharded_state_dict = _fixed_sharded_state_dict(
        optimizer.sharded_state_dict, optimizer, fixes
    )
    optimizer.load_state_dict = _fixed_load_state_dict(optimizer.load_state_dict, optimizer, fixes)
    setattr(optimizer, _APPLIED_ATTR, fixes)
    return list(fixes)
