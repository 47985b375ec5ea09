"""The pretraining loop: short on purpose; every piece it calls is built and tested apart.

    for each step until schedule.train_steps:
        one optimizer step over global_batch_size samples (the backend's train_step, backends.py)
        log every logging.log_interval steps, validate every training.eval_interval
        save every checkpoint.save_interval; stop cleanly on SIGTERM/SIGUSR1

What a step computes (datasets, forward, loss, metrics) is the recipe's (recipe.py); the
loop is the same for every recipe.

`callbacks` (`training/callbacks.py`: step, save, log and evaluate events, as Protocols) run on
every rank; a step callback gets a `LoopContext` holding the live model chunks, the tokenizer,
the config and the metrics logger (the in-training zero-shot evaluation plugs in here, wired by
run/train.py). A callback that sets `loop_state.stop_requested` (early stopping) ends the run
with a save, as a signal does. Validation and callbacks run with the RNG streams saved and
restored around them, so they never change the training trajectory.

The loop never waits on the device between logging steps: each step's loss report stays on
the device (step.StepResult) and is read, with every step's since the last log in one host
read, at the next logging step, before a save and at the end; `loop_state.losses` and
`last_loss` are filled then. The non-finite guard counts on the device and is settled (read,
and raising if the run diverged) at the same points. Batches come from a read-ahead thread
(prefetch.py) that pins them on CUDA.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import psutil
import torch

from megatron_biglm.checkpoint.rng import preserved_rng
from megatron_biglm.config import RunConfig
from megatron_biglm.model.shape import BiGLMShape
from megatron_biglm.training.callbacks import Callbacks
from megatron_biglm.training.distributed import DistInfo
from megatron_biglm.training.flops import mfu, train_step_flops
from megatron_biglm.training.loop_parts import (
    Evaluate,
    MetricsSink,
    NonFiniteCheck,
    Optimizer,
    SaveCheckpoint,
    Scheduler,
    StopSignal,
    TrainBatches,
    TrainStep,
    ValidBatches,
)
from megatron_biglm.training.loop_state import LoopState  # noqa: F401 - re-exported: loop.LoopState
from megatron_biglm.training.prefetch import Prefetched
from megatron_biglm.training.recipe import Recipe, split_report
from megatron_biglm.training.step import evaluate, train_step


@dataclass
class Components:
    """Everything the loop needs, built by run/train.py (or by a test); what each part must do
    is its Protocol in loop_parts.py."""
    config: RunConfig
    info: DistInfo
    model_chunks: list
    optimizer: Optimizer
    scheduler: Scheduler
    guard: NonFiniteCheck
    metrics: MetricsSink
    train_iter_fn: TrainBatches
    valid_iter_fn: ValidBatches | None
    save_fn: SaveCheckpoint
    stop: StopSignal
    model_shape: BiGLMShape
    num_microbatches: int
    recipe: Recipe
    peak_tflops: float | None = None
    callbacks: Callbacks = field(default_factory=Callbacks)
    train_step_fn: TrainStep = train_step   # the backend's step and evaluation (backends.py)
    evaluate_fn: Evaluate = evaluate
    tokenizer: object = None


@dataclass
class LoopContext:
    """What a step callback may read: the live run (the loop owns it; do not step it).
    `callbacks`: the run's callbacks, so a validator can announce its scores (`evaluate`)."""
    model_chunks: list
    tokenizer: object
    config: object
    info: object
    metrics: object
    recipe: Recipe
    callbacks: Callbacks = field(default_factory=Callbacks)


def _memory() -> dict:
    if torch.cuda.is_available():
        return {"mem_alloc_gb": torch.cuda.max_memory_allocated() / 2**30}
    try:
        return {"mem_rss_gb": psutil.Process().memory_info().rss / 2**30}
    except ImportError:  # pragma: no cover
        return {}


class _Window:
    """The steps since the last logging step: their device reports, read in one go."""

    def __init__(self):
        self.t0 = time.time()
        self.steps: list = []   # (StepResult with its stats summarised)

    def add(self, out) -> None:
        out.stats = out.stats.summary()
        self.steps.append(out)

    def read(self, c: Components, state: LoopState, seq: int, gbs: int) -> dict | None:
        """Read the window's reports (one host read), fill the loop state's losses; the
        window's figures, or None when empty."""
        if not self.steps:
            return None
        reports = torch.stack([out.report.to(torch.float64) for out in self.steps]).cpu()
        flops, losses = 0.0, []
        for out, report in zip(self.steps, reports):
            loss, tokens, _ = split_report(report, c.recipe)
            losses.append(loss)
            # This rank saw 1/DP of the global batch: its splits stand in for the other ranks'.
            # Split 0 (variants without the restriction) counts full attention; a recipe that
            # reports no splits counts full attention for every sample.
            splits = out.stats.splits * c.info.dp
            flops += train_step_flops(c.model_shape, seq, gbs, splits=splits if len(splits) == gbs else None,
                                      predicted_tokens=tokens)
        state.losses.extend(losses)
        state.last_loss = losses[-1]
        finite = [x for x in losses if math.isfinite(x)]
        last = self.steps[-1]
        figures = {"steps": len(self.steps), "flops": flops, "loss_avg": sum(finite) / len(finite) if finite
                   else math.nan, "last": last.read(c.recipe) | {"loss": losses[-1]}, "stats": last.stats,
                   "dt": max(time.time() - self.t0, 1e-9)}
        self.t0, self.steps = time.time(), []
        return figures


def run(c: Components, state: LoopState) -> LoopState:
    t = c.config.training
    total = c.config.schedule.train_steps
    last = min(total, state.iteration + t.exit_after_steps) if t.exit_after_steps else total
    data = Prefetched(c.train_iter_fn(state.consumed_samples), depth=2 * c.num_microbatches)
    try:
        return _run(c, state, data, last)
    finally:
        data.close()


def _run(c: Components, state: LoopState, data, last: int) -> LoopState:
    cfg, t = c.config, c.config.training
    seq, mbs, gbs = cfg.data.seq_length, t.micro_batch_size, t.global_batch_size
    window = _Window()
    ctx = LoopContext(model_chunks=c.model_chunks, tokenizer=c.tokenizer, config=cfg, info=c.info,
                      metrics=c.metrics, recipe=c.recipe, callbacks=c.callbacks)

    def log(record: dict) -> None:
        c.metrics.log(record)
        c.callbacks.log(record)

    def settle(at_save: bool = False):
        """Read what the device holds (raises if the run diverged, or, at a save or the last
        step, if every step so far was non-finite); the window's figures."""
        c.guard.settle(state.iteration if at_save or state.iteration == last else None)
        return window.read(c, state, seq, gbs)

    def validate():
        if c.valid_iter_fn is None:
            return
        with preserved_rng():  # training must not depend on whether or how often it validates
            val = c.evaluate_fn(c.model_chunks, c.valid_iter_fn(), iters=t.eval_iters,
                                num_microbatches=c.num_microbatches, seq_length=seq, micro_batch_size=mbs,
                                device=c.info.device, recipe=c.recipe)
        state.last_val_loss = val["loss"]
        if state.first_val_loss is None:
            state.first_val_loss = val["loss"]
        log({"kind": "valid", "step": state.iteration, "loss": val["loss"],
                       "consumed_tokens": state.consumed_tokens,
                       **{k: v for k, v in val.items() if k != "loss"}})

    def save():
        settle(at_save=True)
        return c.save_fn(state)

    if state.iteration == 0 and t.eval_interval > 0:
        validate()
    while state.iteration < last:
        out = c.train_step_fn(c.model_chunks, c.optimizer, c.scheduler, c.guard, data,
                              num_microbatches=c.num_microbatches, seq_length=seq, micro_batch_size=mbs,
                              device=c.info.device, recipe=c.recipe, iteration=state.iteration + 1)
        state.iteration += 1
        state.consumed_samples += gbs
        state.consumed_tokens += gbs * seq
        window.add(out)
        if state.iteration % cfg.logging.log_interval == 0 or state.iteration == last:
            w = settle()
            tflops, util = mfu(w["flops"] / w["steps"], w["dt"] / w["steps"], c.info.world_size, c.peak_tflops)
            now = w["last"]
            log({
                "kind": "train", "step": state.iteration, "loss": now["loss"], "loss_avg": w["loss_avg"],
                "lr": c.optimizer.param_groups[0]["lr"], "grad_norm": now["grad_norm"],
                "tokens_per_s": w["steps"] * gbs * seq / w["dt"], "tflops_per_device": tflops, "mfu": util,
                "consumed_samples": state.consumed_samples, "consumed_tokens": state.consumed_tokens,
                "skipped_nonfinite": c.guard.total_skipped, "phase": w["stats"].phase, **now["metrics"],
                **_memory()})
        if t.eval_interval > 0 and state.iteration % t.eval_interval == 0:
            validate()
        if c.callbacks:
            with preserved_rng():  # e.g. zero-shot evaluation (lm-eval reseeds the global generators)
                c.callbacks.step(state.iteration, state, ctx)
        stop = c.stop.should_stop() or state.stop_requested is not None
        if stop or state.iteration % cfg.checkpoint.save_interval == 0:
            path = save()
            c.metrics.message(f"saved checkpoint {path}")
        if stop:
            state.stopped_by = state.stop_requested or c.stop.name or "signal"
            c.metrics.message(f"received {state.stopped_by}: saved at step {state.iteration}, exiting")
            return state
    settle()
    if t.eval_interval > 0 and state.iteration % t.eval_interval != 0:
        validate()
    if cfg.checkpoint.save_at_end and state.iteration % cfg.checkpoint.save_interval != 0:
        c.save_fn(state)
    return state
