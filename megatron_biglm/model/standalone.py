"""Run a BiGLM model in a plain Python process (no launcher): benchmarks, notebooks, tests.

megatron-core's layers read their process groups from `parallel_state`, so even one CPU
process needs a default group and TP=PP=1 groups. `init_single_process` makes them when
absent (and applies the CPU shims on CUDA-less machines); under a launcher, or when the
groups already exist with the requested sizes, it changes nothing. The group setup itself is
`megatron_biglm.common.process_groups`.
"""
from __future__ import annotations

import torch

from megatron_biglm import patches
from megatron_biglm.common import process_groups


def init_single_process(tp: int = 1, pp: int = 1, seed: int | None = None) -> None:
    """Default process group (gloo on CPU), megatron groups of sizes (tp, pp), optional seed."""
    from megatron.core import tensor_parallel  # lazy: start-up (megatron.core: 2.9 CPU s)

    if not torch.cuda.is_available():
        patches.apply_cpu()
    process_groups.init_default_group()
    process_groups.init_model_parallel(tp, pp, keep_same_sizes=True)
    if seed is not None:
        torch.manual_seed(seed)
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
