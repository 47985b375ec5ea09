"""Graceful stop on SIGTERM / SIGUSR1 / Ctrl-C: finish the current step, save, exit 0.

SLURM sends SIGUSR1 ahead of the time limit (`--signal=USR1@120`) and SIGTERM on preemption; a
person presses Ctrl-C (SIGINT). A second Ctrl-C while the stop is pending gives up on the save
and ends the process at once with one line and exit status 130, as an impatient user expects.
It does not raise KeyboardInterrupt: raised from a handler, that lands wherever the main thread
happens to be (inside logging's lock, a file write) and ends in a traceback and half-released
locks. The checkpoints already sealed are untouched (a save is sealed only once complete).
The handler only sets a flag; the loop checks it between steps, so a checkpoint is never
written from inside a signal handler or in the middle of an optimizer step. Under several
ranks the flag is all-reduced so every rank stops at the same step (a rank that stopped
alone would hang the others in their next collective).

That all-reduce must not stall the device each step: `should_stop` starts the reduction of
this step's flags and answers with the previous step's, which finished long ago (a wait on
the event recorded after its copy to the host, not on the stream). So every rank stops at
the same step, one step after the signal: seconds, well inside SLURM's warning.
"""
from __future__ import annotations

import os
import signal

import torch
import torch.distributed as dist

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
SECOND_CTRL_C = "second Ctrl-C: stopped without saving; the last sealed checkpoint is kept\n"


class GracefulStop:
    """Context manager that records the first stop signal and restores old handlers."""

    def __init__(self, signals=DEFAULT_SIGNALS):
        self.signals = tuple(signals)
        self.received: int | None = None
        self._old = {}
        self._pending = None   # (host tensor, event or None) of the reduction started last step

    def _handler(self, signum, frame):  # noqa: ARG002 - signal API
        if self.received is None:
            self.received = signum
        elif signum == signal.SIGINT:
            os.write(2, SECOND_CTRL_C.encode())  # no Python I/O objects: the interrupted code may hold them
            os._exit(128 + signal.SIGINT)

    def __enter__(self):
        for sig in self.signals:
            self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False

    @property
    def name(self) -> str | None:
        return signal.Signals(self.received).name if self.received is not None else None

    def should_stop(self) -> bool:
        """True on every rank when any rank got a signal. Under several ranks: whether any
        rank had one at the previous call (a collective each call, read one call later)."""
        flag = self.received is not None
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return flag
        previous, self._pending = self._pending, _start_reduction(flag)
        if previous is None:
            return False
        host, event = previous
        if event is not None:
            event.synchronize()
        return bool(host[0] > 0)


def _start_reduction(flag: bool):
    """All-reduce (max) this rank's flag without waiting: (host copy, event to wait on)."""
    device = _device()
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True).wait()  # on CUDA: the stream waits, not the host
    if device == "cpu":
        return t, None
    host = torch.empty(1, pin_memory=True)
    host.copy_(t, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


def _device():
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
