"""THE one process-group setup: default torch.distributed group + megatron's parallel groups.

Training, standalone model use (benchmarks, tests, conversion) and dataset building outside a
launcher all need a default group, some of them megatron's TP/PP groups too. They share these
rules, stated once here:

- Under a launcher (RANK and WORLD_SIZE in the environment) the group comes from `env://`;
  in a plain process it is a world of one on a free localhost port.
- NCCL when CUDA is present (the process first moves to its LOCAL_RANK device), gloo otherwise.
- Whoever creates a group destroys it; an existing group is left alone.
- Tearing down megatron's groups destroys the torch process groups megatron made for them.
  ``parallel_state.destroy_model_parallel`` only forgets them: torch keeps every group it
  made in its registry, and each gloo group keeps its threads (~17 groups and ~50 polling
  threads per init at TP=PP=1). A process that trains many times under one default group
  (a test session, a low-data sweep) would otherwise pile up thousands of threads and
  load the machine by hundreds.

This module sits on floor 0: it imports no other part of megatron_biglm. CPU runs still need
`megatron_biglm.patches.apply_cpu()` before megatron builds a model; callers above apply it.
"""
from __future__ import annotations

import contextlib
import os
import socket
from typing import Iterator, Optional

import torch
import torch.distributed as dist


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1 (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launched() -> bool:
    """True under torchrun/SLURM-style launchers, which export RANK and WORLD_SIZE."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def global_rank() -> int:
    """This process's rank under a launcher (RANK), 0 in a plain process; the group made by
    `init_default_group` has the same rank, and rank 0 is the one that logs."""
    return int(os.environ.get("RANK", 0))


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_default_group(backend: Optional[str] = None) -> bool:
    """Init torch.distributed's default group unless one exists; True if this call made it.

    backend: None picks `default_backend()`. With NCCL the process first selects its
    LOCAL_RANK device (modulo the visible devices), so ranks on one node do not all land on
    device 0.
    """
    if dist.is_initialized():
        return False
    backend = backend or default_backend()
    if backend == "nccl":
        torch.cuda.set_device(local_rank() % torch.cuda.device_count())
    if launched():
        dist.init_process_group(backend, init_method="env://", rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    else:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}",
                                rank=0, world_size=1)
    return True


#: The torch process groups megatron's last ``initialize_model_parallel`` made.
_megatron_groups: list = []


def _live_groups() -> list:
    """Every process group torch holds in this process (torch's own registry; no public API
    lists them)."""
    return list(dist.distributed_c10d._world.pg_map) if dist.is_initialized() else []


def _destroy_megatron_groups() -> None:
    from megatron.core import parallel_state  # lazy: start-up (megatron.core: 2.9 CPU s)

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    live = set(_live_groups())
    for group in _megatron_groups:
        if group in live:
            dist.destroy_process_group(group)
    _megatron_groups.clear()


def init_model_parallel(tp: int = 1, pp: int = 1, *, keep_same_sizes: bool = False) -> None:
    """megatron's parallel_state groups of sizes (tp, pp); needs the default group.

    Existing groups are destroyed and rebuilt, unless `keep_same_sizes` and they already have
    the requested sizes (then nothing changes, e.g. a notebook calling twice).
    """
    from megatron.core import parallel_state  # lazy: start-up (megatron.core: 2.9 CPU s)

    if parallel_state.model_parallel_is_initialized():
        sizes = (parallel_state.get_tensor_model_parallel_world_size(),
                 parallel_state.get_pipeline_model_parallel_world_size())
        if keep_same_sizes and sizes == (tp, pp):
            return
    _destroy_megatron_groups()
    before = set(_live_groups())
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp,
                                             pipeline_model_parallel_size=pp)
    _megatron_groups.extend(g for g in _live_groups() if g not in before)


def destroy(created_group: bool) -> None:
    """Tear down megatron's groups, and the default group if this process created it."""
    _destroy_megatron_groups()
    if created_group and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def single_process_group() -> Iterator[None]:
    """A world-size-1 gloo group for the block if none exists; destroyed on exit if made here.

    megatron-core's dataset builder calls torch.distributed (barriers, ranks) while writing its
    index cache, so tools, benchmarks and tests that build datasets in a plain process need it.
    """
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
