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

from megatron_biglm.training.optimizer_step import device_skipping_optimizers, device_step
from megatron_biglm.training.recipe import Recipe, add_report, report_width, split_report


@dataclass
class StepStats:
    """What the micro-batches of one step looked like (the attention splits, for FLOPs, and the phase).

    It keeps the loader's own (host) tensors and reads them only when asked, at logging
    steps: recording a step reads nothing."""
    batches: list = field(default_factory=list)
    recipe: Recipe | None = None

    def record(self, batch: dict, recipe: Recipe) -> None:
        self.recipe = recipe
        self.batches.append(batch)

    @property
    def splits(self) -> list:
        """One split per sample when the recipe reports them, else []."""
        return [s for b in self.batches for s in (self.recipe.attention_splits(b) or [])]

    @property
    def phase(self) -> int:
        phases = [int(torch.as_tensor(b["phase"]).max()) for b in self.batches if "phase" in b]
        return max(phases, default=0)

    def summary(self) -> "StepStats":
        """The same figures, with the batches' other tensors let go (what the loop keeps
        until its next logging step)."""
        keep = ("split", "phase")
        out = StepStats(recipe=self.recipe)
        for b in self.batches:
            out.batches.append({k: b[k] for k in keep if k in b})
        return out


@dataclass
class StepResult:
    """One optimizer step, as the loop sees it: the summed report (recipe.add_report) and the
    gradient norm stay where they were computed (the device) until the loop reads them at a
    logging step (`read`)."""
    report: torch.Tensor
    grad_norm: object          # a float, a 0-d tensor, or None (no norm: skipped or unclipped)
    stats: StepStats

    def read(self, recipe: Recipe | None) -> dict:
        """{"loss", "tokens", "metrics", "grad_norm"} on the host."""
        loss, tokens, metrics = split_report(self.report, recipe)
        norm = math.nan if self.grad_norm is None else float(self.grad_norm)
        return {"loss": loss, "tokens": tokens, "metrics": metrics, "grad_norm": norm}


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
               micro_batch_size, device, recipe, iteration) -> StepResult:
    """Run one optimizer step; a step whose loss is NaN/inf changes no weight and no optimizer
    state (the guard counts it).

    Nothing here reads the device on the host: the loss stays in the summed report, and the
    norm, clipping and skip run on the device (optimizer_step.py). Where that cannot drive
    the optimizer, megatron's own `step()` runs and the guard reads the loss on the host."""
    for chunk in model_chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    stats = StepStats()
    losses = forward_backward(model_chunks, data_iterator, num_microbatches, seq_length, micro_batch_size,
                              make_forward_step(device, recipe, stats))
    report = reduce_reports(losses, device, recipe)
    scheduler.step(1)  # lr of this step = lr(iteration): see schedule.py
    inner = device_skipping_optimizers(optimizer)
    if inner is not None:
        norm = device_step(optimizer, inner, guard, report[0] / report[1], iteration, report.device)
        return StepResult(report, norm, stats)
    loss, _, _ = split_report(report, recipe)
    if not guard.check(loss, iteration):
        optimizer.zero_grad()
        return StepResult(report, None, stats)
    ok, grad_norm, _ = optimizer.step()
    return StepResult(report, grad_norm if ok else None, stats)


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

