"""Run one GPU-benchmark section under its own time budget and its own guard.

A section that raises, overruns its budget or lacks an optional package ends with a record
(status, error, elapsed seconds, compile counts) instead of ending the run: the next section
still runs and the JSON keeps everything measured so far.

The budget is a SIGALRM timer that raises `SectionOverrun` in the main thread; it derives from
BaseException so a section's own `except Exception` cannot swallow it. Subprocesses a section
started under `subprocess.run` are killed as the exception unwinds through it. A hang inside
one C call (a CUDA kernel that never returns) is out of reach of any in-process guard: the
device script's outer `timeout` ends the run, and `--resume` picks up the sections the JSON
lacks.
"""
from __future__ import annotations

import importlib.util
import signal
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass


class SectionOverrun(BaseException):
    """Raised in the main thread when a section runs past its budget."""


@dataclass
class Outcome:
    """What happened to one section: `figures` (None unless it produced any) and the record
    that goes under `sections.<name>` in the JSON."""
    figures: dict | None
    record: dict


def missing_package(packages) -> str | None:
    """The first of `packages` that cannot be imported here, or None."""
    for name in packages:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):  # a parent package missing, or an import blocker
            return name
    return None


@contextmanager
def _alarm(budget_s: float):
    def fire(signum, frame):
        raise SectionOverrun(f"ran past its budget of {budget_s:g} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, budget_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_guarded(fn, *, budget_s: float, requires=(), counts=None) -> Outcome:
    """`fn()` (returns the section's figures) under a `budget_s` timer.

    `requires`: optional packages; the first one missing makes the section `skipped` without
    running it (also when the section itself fails to import one of them). `counts`: a
    module with `snapshot()` and `since(before)` (compile counts), recorded for every outcome."""
    t0 = time.perf_counter()
    missing = missing_package(requires)
    record = dict(budget_s=budget_s)
    if missing is not None:
        record.update(status="skipped", error=f"skipped: {missing} not installed", elapsed_s=0.0)
        return Outcome(None, record)
    before = counts.snapshot() if counts else None
    figures = None
    try:
        with _alarm(budget_s):
            figures = fn()
        record["status"] = "ok"
    except SectionOverrun as exc:
        if figures is not None:  # the timer fired between the section's return and its disarming
            record["status"] = "ok"
        else:
            record.update(status="overrun", error=str(exc))
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in requires:
            record.update(status="skipped", error=f"skipped: {exc.name.split('.')[0]} not installed")
        else:
            record.update(status="error", error=f"{type(exc).__name__}: {exc}",
                          traceback=traceback.format_exc(limit=8))
    except Exception as exc:  # noqa: BLE001 - recorded, and the next section runs
        record.update(status="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(limit=8))
    record["elapsed_s"] = time.perf_counter() - t0
    if counts is not None:
        try:
            record.update(counts.since(before))
        except Exception as exc:  # noqa: BLE001 - the counts are extra; never lose the section over them
            record["counts_error"] = f"{type(exc).__name__}: {exc}"
    return Outcome(figures, record)
