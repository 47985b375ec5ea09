"""megatron's gradient finalisation, with the per-token scaling done without a host read.

megatron-core's `finalize_model_grads` divides the gradients by the global token count
(`calculate_per_token_loss`) behind `if num_tokens > 0`: a host read of a device tensor, so
a device sync, every step. This is the same finalisation (megatron's function, called with
no count) followed by the same count's collectives and scaling, with the division guarded on
the device instead: a count of 0 divides by 1 (the gradients are then all zero, as the loss
was an empty sum), which is megatron's "no scaling" in effect.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed import finalize_model_grads


def finalize_model_grads_per_token(model, num_tokens: torch.Tensor | None = None, **kwargs):
    """`config.finalize_model_grads_func` for per-token losses (same signature as megatron's)."""
    finalize_model_grads(model, None, **kwargs)
    if num_tokens is None:
        return
    if dist.is_initialized():
        # the count is only on the last pipeline stage; then summed over the data-parallel ranks
        if parallel_state.get_pipeline_model_parallel_world_size() > 1:
            dist.broadcast(num_tokens, src=parallel_state.get_pipeline_model_parallel_last_rank(),
                           group=parallel_state.get_pipeline_model_parallel_group())
        group = parallel_state.get_data_parallel_group(with_context_parallel=True)
        if dist.get_world_size(group) > 1:  # a sum over one rank is the count itself
            dist.all_reduce(num_tokens, group=group)
    scaling = 1.0 / num_tokens.clamp(min=1)
    for chunk in model:
        chunk.scale_gradients(scaling)
