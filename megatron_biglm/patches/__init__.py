"""megatron-core workarounds, applied only through explicit calls.

    from megatron_biglm import patches
    patches.apply_cpu()   # once, at process start, before building megatron models

    optimizer = get_megatron_optimizer(...)
    patches.apply_distopt_checkpoint_fixes(optimizer)  # then save/load with DISTOPT_METADATA

`apply_cpu` installs the CPU shims (one file each, `cpu_*.py`) only when CUDA is absent;
`apply_distopt_checkpoint_fixes` fixes one optimizer instance (distopt_checkpoint.py);
`apply_mlp_subclass_notice` quiets megatron's per-layer notice about an `MLP` subclass
(mlp_subclass_notice.py), and `apply_rope_one_pass` computes megatron's unfused RoPE in one
pass per direction (rope_one_pass.py), and `apply_row_linear_tp_group` hands megatron's
row-parallel matmul its layer's group instead of None, whose deprecation warning breaks a
compiled layer's graph (row_linear_tp_group.py); all three are called where BiGLM's layer spec is built.
Nothing here patches anything at import time. Each module docstring names the exact failure
it fixes and the megatron-core versions it was seen in.
"""
from __future__ import annotations

from typing import Iterable, List

import torch

from . import (
    cpu_current_device,
    cpu_device_mode,
    cpu_rng_tracker,
    cpu_streams,
    cpu_synchronize,
    cpu_tensor_type,
    mlp_subclass_notice,
    rope_one_pass,
    row_linear_tp_group,
)
from ._patching import Patch, log
from .distopt_checkpoint import (
    DISTOPT_METADATA,
    apply_distopt_checkpoint_fixes,
    distopt_after_load,
    distopt_before_load,
)

CPU_PATCHES: tuple[Patch, ...] = (
    cpu_current_device.PATCH,
    cpu_synchronize.PATCH,
    cpu_streams.PATCH,
    cpu_device_mode.PATCH,
    cpu_tensor_type.PATCH,
    cpu_rng_tracker.PATCH,
)
CPU_PATCH_NAMES: tuple[str, ...] = tuple(p.name for p in CPU_PATCHES)

_APPLIED: List[str] = []


def apply_cpu(force: bool = False, skip: Iterable[str] = ()) -> List[str]:
    """Install the CPU shims; return the names of all CPU shims installed so far.

    No-op (returns []) when `torch.cuda.is_available()`, unless `force=True` (tests).
    Idempotent: a second call installs nothing new. `skip` leaves the named shims out
    (tests use it to show the failure each one prevents).
    """
    skip = set(skip)
    unknown = skip.difference(CPU_PATCH_NAMES)
    if unknown:
        raise ValueError(f"unknown CPU patch names {sorted(unknown)}; known: {CPU_PATCH_NAMES}")
    if torch.cuda.is_available() and not force:
        log.info("CUDA is available: CPU shims not applied")
        return []
    for patch in CPU_PATCHES:
        if patch.name in skip or patch.name in _APPLIED:
            continue
        if patch.apply():
            _APPLIED.append(patch.name)
        else:
            log.info("CPU shim %s not needed in this version", patch.name)
    return list(_APPLIED)


def apply_mlp_subclass_notice() -> bool:
    """Install `mlp_subclass_notice` (idempotent); False where this megatron-core has no such notice."""
    return mlp_subclass_notice.PATCH.apply()


def apply_rope_one_pass() -> bool:
    """Install `rope_one_pass` (idempotent); False where megatron's attention module is absent."""
    return rope_one_pass.PATCH.apply()


def apply_row_linear_tp_group() -> bool:
    """Install `row_linear_tp_group` (idempotent); False where megatron has no `RowParallelLinear`."""
    return row_linear_tp_group.PATCH.apply()


def applied_cpu_patches() -> List[str]:
    """Names of the CPU shims installed in this process."""
    return list(_APPLIED)


__all__ = [
    "apply_cpu", "applied_cpu_patches", "CPU_PATCHES", "CPU_PATCH_NAMES", "Patch",
    "apply_distopt_checkpoint_fixes", "DISTOPT_METADATA", "distopt_before_load",
    "distopt_after_load", "apply_mlp_subclass_notice", "apply_rope_one_pass",
    "apply_row_linear_tp_group",
]
