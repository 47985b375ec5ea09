"""Run a BiGLM model in a plain Python process (no launcher): benchmarks, notebooks, tests.

megatron-core's layers read their process groups from `parallel_state`, so even one CPU
process needs a default group and TP=PP=1 groups. `init_single_process` makes them when
absent (and applies the CPU shims on CUDA-less machines); under a launcher, or when the
groups already exist with the requested sizes, it changes nothing.
"""
from __future__ import annotations

import os
import socket

import torch


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_single_process(tp: int = 1, pp: int = 1, seed: int | None = None) -> None:
    """Default process group (gloo on CPU), megatron groups of sizes (tp, pp), optional seed."""
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    if not torch.cuda.is_available():
        from megatron_biglm import patches

        patches.apply_cpu()
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend)
        else:
            dist.init_process_group(
                backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
            )
    sizes = None
    if parallel_state.model_parallel_is_initialized():
        sizes = (parallel_state.get_tensor_model_parallel_world_size(),
                 parallel_state.get_pipeline_model_parallel_world_size())
        if sizes != (tp, pp):
            parallel_state.destroy_model_parallel()
    if sizes != (tp, pp):
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp
        )
    if seed is not None:
        torch.manual_seed(seed)
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
