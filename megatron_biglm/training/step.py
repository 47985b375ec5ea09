"""One training step and one validation pass over megatron-core's pipeline schedules.

The loss is a per-token mean over the whole global batch: each micro-batch returns
(loss sum, masked-token count) and megatron divides the gradients by the global count
(`calculate_per_token_loss=True`). So the loss and the update do not depend on how the
batch is cut into micro-batches and ranks, which is what lets DP/TP/PP runs and resumed
runs reproduce a single-process run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from megatron_biglm.model.loss import masked_lm_loss_func


@dataclass
class StepStats:
    """What the micro-batches of one step looked like (for FLOPs and token counts)."""
    splits: list = field(default_factory=list)
    samples: int = 0
    predicted_tokens: int = 0
    phase: int = 0


def make_forward_step(device, stats: StepStats | None = None):
    """The `forward_step_func` for megatron schedules: read a micro-batch, run the chunk.

    `split` alone says how attention is restricted (0 = full attention: the variants without
    the restriction emit 0). It goes to the model as the loader's CPU tensor: the model sees
    there, without a device sync, whether any row is restricted, then moves it."""

    def forward_step(data_iterator, model):
        batch = next(data_iterator)
        tokens = batch["tokens"].to(device, non_blocking=True)
        loss_mask = batch["loss_mask"].to(device, non_blocking=True)
        split = batch["split"]
        if stats is not None:
            stats.samples += tokens.shape[0]
            stats.predicted_tokens += int((batch["loss_mask"] != 0).sum())
            stats.splits.extend(split.tolist())
            if "phase" in batch:
                stats.phase = int(torch.as_tensor(batch["phase"]).max())
        output = model(tokens, split=split, labels=batch["labels"].to(device, non_blocking=True),
                       loss_mask=loss_mask)
        return output, partial(masked_lm_loss_func, loss_mask)

    return forward_step


def reduce_loss(losses_reduced, device) -> tuple[float, int]:
    """(global mean loss, global predicted tokens) on every rank.

    Only the last pipeline stage holds micro-batch losses, and its TP ranks hold copies:
    count each once (tp rank 0 of the last stage), then sum over the whole world."""
    total = torch.zeros(2, dtype=torch.float64, device=device)
    if (parallel_state.is_pipeline_last_stage(ignore_virtual=True)
            and parallel_state.get_tensor_model_parallel_rank() == 0):
        for item in losses_reduced:
            total += item["lm loss"].to(device=device, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total)
    loss_sum, count = float(total[0]), int(total[1])
    return (loss_sum / count if count else math.nan), count


def forward_backward(model_chunks, data_iterator, num_microbatches, seq_length, micro_batch_size,
                     forward_step, forward_only=False):
    return get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=data_iterator, model=model_chunks,
        num_microbatches=num_microbatches, seq_length=seq_length, micro_batch_size=micro_batch_size,
        forward_only=forward_only)


def train_step(model_chunks, optimizer, scheduler, guard, data_iterator, *, num_microbatches, seq_length,
               micro_batch_size, device, iteration):
    """Run one optimizer step (skipped when the loss is NaN/inf). Returns a dict of stats."""
    for chunk in model_chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    stats = StepStats()
    losses = forward_backward(model_chunks, data_iterator, num_microbatches, seq_length, micro_batch_size,
                              make_forward_step(device, stats))
    loss, tokens = reduce_loss(losses, device)
    scheduler.step(1)  # lr of this step = lr(iteration): see schedule.py
    if not guard.check(loss, iteration):
        optimizer.zero_grad()
        return {"loss": loss, "skipped": True, "grad_norm": math.nan, "stats": stats, "tokens": tokens}
    ok, grad_norm, _ = optimizer.step()
    return {"loss": loss, "skipped": not ok, "grad_norm": float(grad_norm) if grad_norm is not None else math.nan,
            "stats": stats, "tokens": tokens}


@torch.no_grad()
def evaluate(model_chunks, data_iterator, *, iters, num_microbatches, seq_length, micro_batch_size,
             device) -> float:
    """Per-token validation loss over `iters` global batches."""
    for chunk in model_chunks:
        chunk.eval()
    total = torch.zeros(2, dtype=torch.float64)
    try:
        for _ in range(iters):
            losses = forward_backward(model_chunks, data_iterator, num_microbatches, seq_length,
                                      micro_batch_size, make_forward_step(device),
                                      forward_only=True)
            loss, count = reduce_loss(losses, device)
            total += torch.tensor([loss * count, count], dtype=torch.float64)
    finally:
        for chunk in model_chunks:
            chunk.train()
    return float(total[0] / total[1]) if total[1] else math.nan
