"""What the loop needs from each part it is handed, as `typing.Protocol`s.

`loop.Components` is built by run/train.py from whichever backend runs (megatron or
DeepSpeed) and by tests; these Protocols say what each field must do, so a backend or a
test part is checked against one written contract instead of the loop's call sites.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Protocol, runtime_checkable

from megatron_biglm.training.loop_state import LoopState
from megatron_biglm.training.recipe import Recipe


@runtime_checkable
class Optimizer(Protocol):
    """The loop reads the learning rate; the backend's step zeroes and steps it."""
    param_groups: list


@runtime_checkable
class Scheduler(Protocol):
    def step(self, increment: int) -> None: ...


@runtime_checkable
class NonFiniteCheck(Protocol):
    """Decides whether a step is applied and counts the skipped ones: on the host from a loss
    (`check`), or on the device from the loss and gradient norm (`observe`, read back at a
    logging step or a save by `settle`, which raises after too many in a row)."""
    @property
    def total_skipped(self) -> int: ...

    def check(self, loss: float, step: int) -> bool: ...

    def observe(self, step: int, *values) -> object: ...

    def settle(self) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@runtime_checkable
class MetricsSink(Protocol):
    def log(self, record: dict) -> None: ...

    def message(self, text: str) -> None: ...


@runtime_checkable
class StopSignal(Protocol):
    """Whether the run was asked to stop (a collective when distributed), and by what."""
    @property
    def name(self) -> str | None: ...

    def should_stop(self) -> bool: ...


class TrainBatches(Protocol):
    """consumed_samples -> the iterator of micro-batches from that point on."""
    def __call__(self, consumed_samples: int) -> Iterator: ...


class ValidBatches(Protocol):
    def __call__(self) -> Iterator: ...


class SaveCheckpoint(Protocol):
    """Saves the run at this state; returns the checkpoint's path."""
    def __call__(self, state: LoopState) -> Path: ...


@runtime_checkable
class StepOutcome(Protocol):
    """One optimizer step as the loop holds it until a logging step: its `stats`, and `read`,
    the one host read of its loss, tokens, metrics and gradient norm (step.StepResult)."""
    stats: object

    def read(self, recipe: Recipe | None) -> dict: ...


class TrainStep(Protocol):
    """One optimizer step, its numbers left on the device (a StepOutcome)."""
    def __call__(self, model_chunks: list, optimizer: Optimizer, scheduler: Scheduler, guard: NonFiniteCheck,
                 data_iterator: Iterator, *, num_microbatches: int, seq_length: int, micro_batch_size: int,
                 device, recipe: Recipe, iteration: int) -> StepOutcome: ...


class Evaluate(Protocol):
    """{"loss": per-token validation loss over `iters` global batches, **the recipe's metrics}."""
    def __call__(self, model_chunks: list, data_iterator: Iterator, *, iters: int, num_microbatches: int,
                 seq_length: int, micro_batch_size: int, device, recipe: Recipe) -> dict: ...
