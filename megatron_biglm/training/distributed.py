"""Process groups for a run: torch.distributed (NCCL on GPU, gloo on CPU) + megatron's
parallel_state, plus seeding. Works under torchrun and as a plain single process.

CPU runs need `patches.apply_cpu()` (megatron-core assumes CUDA in a few places) before any
model is built; it is a no-op when CUDA is present.
"""
from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel

from megatron_biglm.config import ConfigError, RunConfig


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(config: RunConfig) -> DistInfo:
    """Init the default group (if not yet), megatron's model-parallel groups and the seeds."""
    use_cuda = torch.cuda.is_available()
    if not use_cuda:
        from megatron_biglm import patches
        patches.apply_cpu()
    created = False
    if not dist.is_initialized():
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            init = "env://"
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        else:
            init, rank, world = f"tcp://127.0.0.1:{_free_port()}", 0, 1
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if use_cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl" if use_cuda else "gloo", init_method=init, rank=rank, world_size=world)
        created = True
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    tp = config.parallelism.tensor_model_parallel_size
    pp = config.parallelism.pipeline_model_parallel_size
    if world % (tp * pp):
        raise ConfigError(f"world size {world} is not divisible by tensor × pipeline parallel = {tp} × {pp}; "
                          f"launch a multiple of {tp * pp} processes")
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    seed_everything(config.training.seed)
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
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if info.created_group and dist.is_initialized():
        dist.destroy_process_group()
