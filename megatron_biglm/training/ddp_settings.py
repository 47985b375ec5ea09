"""megatron DDP's communication settings from the run config's `training:` section (and whether
the distributed optimizer is on), `auto` resolved for this machine.

`training.overlap_grad_reduce` and `training.overlap_param_gather` hide the data-parallel
gradient reduction behind the backward pass and the distributed optimizer's parameter
all-gather behind the next forward pass: `auto` turns them on with CUDA (NCCL) and off on
CPU, where gloo gains nothing from it. `training.check_for_nan_in_grad` makes a non-finite
gradient fatal inside the reduction; `auto` leaves it off, because the loop's non-finite-step
guard (`training.max_nonfinite_in_a_row`) skips such steps, and it can only see them if the
reduction lets them through. Combinations megatron-core rejects or runs wrongly are refused
here, with the fix, before any model is built.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from megatron.core.distributed import DistributedDataParallelConfig

from megatron_biglm.config import ConfigError, TrainingConfig


@dataclass(frozen=True)
class DDPSettings:
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    check_for_nan_in_grad: bool


def resolve_ddp_settings(t: TrainingConfig, distopt: bool) -> DDPSettings:
    """The settings a run with `training:` section `t` uses (`distopt`:
    `optimizer.use_distributed_optimizer`); ConfigError for a combination that cannot work."""
    cuda = torch.cuda.is_available()
    grad = cuda if t.overlap_grad_reduce == "auto" else t.overlap_grad_reduce
    param = (cuda and distopt and grad) if t.overlap_param_gather == "auto" else t.overlap_param_gather
    if param and not distopt:
        raise ConfigError("training.overlap_param_gather=true needs the distributed optimizer: set "
                          "optimizer.use_distributed_optimizer=true, or training.overlap_param_gather=false")
    if param and not grad:
        raise ConfigError("training.overlap_param_gather=true needs training.overlap_grad_reduce=true "
                          "(megatron overlaps the all-gather only together with the reduce-scatter)")
    nan = False if t.check_for_nan_in_grad == "auto" else t.check_for_nan_in_grad
    return DDPSettings(overlap_grad_reduce=grad, overlap_param_gather=param, check_for_nan_in_grad=nan)


def ddp_config(training: TrainingConfig, use_distributed_optimizer: bool) -> DistributedDataParallelConfig:
    """megatron's DDP config: fp32 gradient reduction, the distributed optimizer as configured
    and the resolved communication settings."""
    s = resolve_ddp_settings(training, use_distributed_optimizer)
    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=use_distributed_optimizer,
        overlap_grad_reduce=s.overlap_grad_reduce, overlap_param_gather=s.overlap_param_gather,
        check_for_nan_in_grad=s.check_for_nan_in_grad)


__all__ = ["DDPSettings", "ddp_config", "resolve_ddp_settings"]
