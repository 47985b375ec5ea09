"""Process groups for a run: torch.distributed (NCCL on GPU, gloo on CPU) + megatron's
parallel_state, plus seeding. Works under torchrun and as a plain single process.

CPU runs need `patches.apply_cpu()` (megatron-core assumes CUDA in a few places) before any
model is built; it is a no-op when CUDA is present.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel

from megatron_biglm import patches
from megatron_biglm.common import process_groups
from megatron_biglm.config import ConfigError, ParallelismConfig


@dataclass
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    tp: int
    pp: int
    dp: int
    dp_rank: int
    device: torch.device
    created_group: bool

    @property
    def is_logger(self) -> bool:
        """Rank 0 logs; the loss lives on the last pipeline stage but is all-reduced to all."""
        return self.rank == 0


def init_distributed(parallelism: ParallelismConfig, seed: int) -> DistInfo:
    """Init the default group (if not yet), megatron's model-parallel groups as `parallelism:`
    says, and the seeds (`training.seed`)."""
    use_cuda = torch.cuda.is_available()
    if not use_cuda:
        patches.apply_cpu()
    created = process_groups.init_default_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = process_groups.local_rank()
    tp = parallelism.tensor_model_parallel_size
    pp = parallelism.pipeline_model_parallel_size
    if world % (tp * pp):
        raise ConfigError(f"world size {world} is not divisible by tensor × pipeline parallel = {tp} × {pp}; "
                          f"launch a multiple of {tp * pp} processes")
    process_groups.init_model_parallel(tp, pp)
    seed_everything(seed)
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, tp=tp, pp=pp,
                    dp=parallel_state.get_data_parallel_world_size(),
                    dp_rank=parallel_state.get_data_parallel_rank(),
                    device=torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu"),
                    created_group=created)


def seed_everything(seed: int) -> None:
    """Same seed on every rank for init (megatron offsets TP/PP ranks itself where needed)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)  # CPU: patches' cpu_rng_tracker


def shutdown(info: DistInfo) -> None:
    process_groups.destroy(info.created_group)
