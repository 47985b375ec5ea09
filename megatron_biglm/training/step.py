"""One training step and one validation pass over megatron-core's pipeline schedules.

The loss is a per-token mean over the whole global batch: each micro-batch returns
(loss sum, token count) and megatron divides the gradients by the global count
(`calculate_per_token_loss=True`). So the loss and the update do not depend on how the
batch is cut into micro-batches and ranks, which is what lets DP/TP/PP runs and resumed
runs reproduce a single-process run. What a micro-batch's forward and loss are is the
recipe's (recipe.py); this module only drives the schedule and reduces the reports.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from megatron_biglm.training.recipe import Recipe, add_report, report_width, split_report


@dataclass
class StepStats:
    """What the micro-batches of one step looked like (for FLOPs and token counts)."""
    splits: list = field(default_factory=list)   # one per sample when the recipe reports them
    samples: int = 0
    predicted_tokens: int = 0
    phase: int = 0

    def record(self, batch: dict, recipe: Recipe) -> None:
        self.samples += batch["tokens"].shape[0]
        self.predicted_tokens += recipe.loss_tokens(batch)
        self.splits.extend(recipe.attention_splits(batch) or [])
        if "phase" in batch:
            self.phase = int(torch.as_tensor(batch["phase"]).max())


def make_forward_step(device, recipe: Recipe, stats: StepStats | None = None):
    """The `forward_step_func` for megatron schedules: read a micro-batch, run the recipe's forward."""

    def forward_step(data_iterator, model):
        batch = next(data_iterator)
        if stats is not None:
            stats.record(batch, recipe)
        return recipe.forward(model, batch, device)

    return forward_step


def reduce_reports(losses_reduced, device, recipe: Recipe | None = None) -> torch.Tensor:
    """The micro-batch reports summed over the global batch, on every rank (recipe.add_report).

    Only the last pipeline stage holds micro-batch reports, and its TP ranks hold copies:
    count each once (tp rank 0 of the last stage), then sum over the whole world."""
    total = torch.zeros(report_width(recipe), dtype=torch.float64, device=device)
    if (parallel_state.is_pipeline_last_stage(ignore_virtual=True)
            and parallel_state.get_tensor_model_parallel_rank() == 0):
        for item in losses_reduced:
            add_report(total, item, recipe)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total)
    return total


def forward_backward(model_chunks, data_iterator, num_microbatches, seq_length, micro_batch_size,
                     forward_step, forward_only=False):
    return get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=data_iterator, model=model_chunks,
        num_microbatches=num_microbatches, seq_length=seq_length, micro_batch_size=micro_batch_size,
        forward_only=forward_only)


def train_step(model_chunks, optimizer, scheduler, guard, data_iterator, *, num_microbatches, seq_length,
               micro_batch_size, device, recipe, iteration):
    """Run one optimizer step (skipped when the loss is NaN/inf). Returns a dict of stats."""
    for chunk in model_chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    stats = StepStats()
    losses = forward_backward(model_chunks, data_iterator, num_microbatches, seq_length, micro_batch_size,
                              make_forward_step(device, recipe, stats))
    loss, tokens, metrics = split_report(reduce_reports(losses, device, recipe), recipe)
    scheduler.step(1)  # lr of this step = lr(iteration): see schedule.py
    if not guard.check(loss, iteration):
        optimizer.zero_grad()
        return {"loss": loss, "skipped": True, "grad_norm": math.nan, "stats": stats, "tokens": tokens,
                "metrics": metrics}
    ok, grad_norm, _ = optimizer.step()
    return {"loss": loss, "skipped": not ok, "grad_norm": float(grad_norm) if grad_norm is not None else math.nan,
            "stats": stats, "tokens": tokens, "metrics": metrics}


@torch.no_grad()
def evaluate(model_chunks, data_iterator, *, iters, num_microbatches, seq_length, micro_batch_size, device,
             recipe) -> dict:
    """{"loss": per-token validation loss over `iters` global batches, **the recipe's metrics}."""
    for chunk in model_chunks:
        chunk.eval()
    total = torch.zeros(2, dtype=torch.float64)
    extra = torch.zeros(report_width(recipe), dtype=torch.float64)
    try:
        for _ in range(iters):
            losses = forward_backward(model_chunks, data_iterator, num_microbatches, seq_length,
                                      micro_batch_size, make_forward_step(device, recipe),
                                      forward_only=True)
            reports = reduce_reports(losses, device, recipe)
            loss, count, _ = split_report(reports, recipe)
            total += torch.tensor([loss * count, count], dtype=torch.float64)
            extra += reports.cpu()
    finally:
        for chunk in model_chunks:
            chunk.train()
    return {"loss": float(total[0] / total[1]) if total[1] else math.nan,
            **split_report(extra, recipe)[2]}

