"""What a run hooks into the loop, as `typing.Protocol`s: each callback implements the events
it wants, and the loop dispatches by `isinstance`, never by probing for attributes.

  StartCallback     on_start()                        once the run is built and every check has passed
                                                      (batches, start point, model, optimizer), before
                                                      anything is written to the run directory
  StepCallback      on_step(step, loop_state, ctx)    after every optimizer step (ctx: LoopContext,
                                                      the live model chunks, tokenizer, config)
  SaveCallback      on_save(loop_state, path)         once a checkpoint is sealed on disk
  LogCallback       on_log(record)                    every record the metrics logger writes
                                                      (kind "train" or "valid", or a recipe's)
  EvaluateCallback  on_evaluate(step, scores, loop_state)  a recipe's task scores at a validation
                                                      (fine-tuning: accuracy, F1, ...)

A plain function `f(step, loop_state)` is a step callback. Every callback runs on every rank,
with the RNG streams saved and restored around it. A callback is built with the settings it
reads (the start event carries none). A callback stops the run cleanly by setting
`loop_state.stop_requested` to its reason (early stopping): the loop saves and returns with
`stopped_by` set to that reason, as it does for a signal.
"""
from __future__ import annotations

from typing import Callable, Iterable, Protocol, runtime_checkable


@runtime_checkable
class StartCallback(Protocol):
    def on_start(self) -> None: ...


@runtime_checkable
class StepCallback(Protocol):
    def on_step(self, step: int, loop_state, ctx) -> None: ...


@runtime_checkable
class SaveCallback(Protocol):
    def on_save(self, loop_state, path) -> None: ...


@runtime_checkable
class LogCallback(Protocol):
    def on_log(self, record: dict) -> None: ...


@runtime_checkable
class EvaluateCallback(Protocol):
    def on_evaluate(self, step: int, scores: dict, loop_state) -> None: ...


EVENTS = (StartCallback, StepCallback, SaveCallback, LogCallback, EvaluateCallback)


class _Function:
    """A plain `f(step, loop_state)` as a step callback."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def on_step(self, step: int, loop_state, ctx) -> None:  # noqa: ARG002 - the protocol
        self.fn(step, loop_state)


class Callbacks:
    """The run's callbacks, checked once: an object that implements none of the events (and
    is not a function) is refused when the run is built, naming what it could implement."""

    def __init__(self, callbacks: Iterable = ()):
        self.items: list = []
        for cb in callbacks:
            if not isinstance(cb, EVENTS):
                if not callable(cb):
                    names = ", ".join(f"{p.__name__} ({_method(p)})" for p in EVENTS)
                    raise TypeError(f"callback {cb!r} implements none of the loop's events; give it one of "
                                    f"{names}, or pass a function f(step, loop_state)")
                cb = _Function(cb)
            self.items.append(cb)

    def __bool__(self) -> bool:
        return bool(self.items)

    def __iter__(self):
        return iter(self.items)

    def start(self) -> None:
        for cb in self.items:
            if isinstance(cb, StartCallback):
                cb.on_start()

    def step(self, step: int, loop_state, ctx) -> None:
        for cb in self.items:
            if isinstance(cb, StepCallback):
                cb.on_step(step, loop_state, ctx)

    def save(self, loop_state, path) -> None:
        for cb in self.items:
            if isinstance(cb, SaveCallback):
                cb.on_save(loop_state, path)

    def log(self, record: dict) -> None:
        for cb in self.items:
            if isinstance(cb, LogCallback):
                cb.on_log(record)

    def evaluate(self, step: int, scores: dict, loop_state) -> None:
        for cb in self.items:
            if isinstance(cb, EvaluateCallback):
                cb.on_evaluate(step, scores, loop_state)


def _method(protocol) -> str:
    return next(name for name in vars(protocol) if name.startswith("on_"))
