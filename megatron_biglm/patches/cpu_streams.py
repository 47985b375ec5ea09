"""CPU shim: CUDA streams become a do-nothing stream object and a null context.

Failure fixed: ``AssertionError: Torch not compiled with CUDA enabled`` from
``torch.cuda.current_stream()`` / ``torch.cuda.default_stream()`` and ``RuntimeError:
torch.cuda.Stream requires CUDA support`` from ``torch.cuda.Stream(...)``: in
``pipeline_parallel.utils.set_streams`` (overlapped 1F1B schedules), and in DDP gradient sync
with a communication stream (``DistributedDataParallel.__init__`` and the bucket group's
``start_grad_sync``/``finish_grad_sync`` when ``num_distributed_optimizer_instances > 1``).
Seen in megatron-core 0.16.1.

On CPU every op runs to completion in order, so waiting on / recording a stream is a no-op.
"""
from __future__ import annotations

import contextlib

import torch

from ._patching import Patch, replace_attr

NAME = "cpu_streams"


class CpuStream:
    """Stands in for torch.cuda.Stream: every synchronization method is a no-op."""

    device = torch.device("cpu")

    def __init__(self, device=None, priority: int = 0, **_unused) -> None:
        self.priority = priority

    def wait_stream(self, stream) -> None:
        return None

    def wait_event(self, event) -> None:
        return None

    def record_event(self, event=None):
        return event if event is not None else CpuEvent()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def __eq__(self, other) -> bool:
        return isinstance(other, CpuStream)

    def __hash__(self) -> int:
        return hash(CpuStream)


class CpuEvent:
    """Stands in for torch.cuda.Event: already complete; elapsed time is not measured."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess=False):
        self.enable_timing = enable_timing

    def record(self, stream=None) -> None:
        return None

    def wait(self, stream=None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


_THE_STREAM = CpuStream()


def _current_stream(device=None) -> CpuStream:
    return _THE_STREAM


def _stream_context(stream=None):
    return contextlib.nullcontext(stream)


def apply() -> bool:
    installed = [
        replace_attr(torch.cuda, "current_stream", lambda _o: _current_stream, NAME),
        replace_attr(torch.cuda, "default_stream", lambda _o: _current_stream, NAME),
        replace_attr(torch.cuda, "stream", lambda _o: _stream_context, NAME),
        replace_attr(torch.cuda, "Stream", lambda _o: CpuStream, NAME),
        replace_attr(torch.cuda, "Event", lambda _o: CpuEvent, NAME),
    ]
    # torch.cuda.set_stream exists in some torch versions only.
    if hasattr(torch.cuda, "set_stream"):
        installed.append(replace_attr(torch.cuda, "set_stream", lambda _o: lambda s: None, NAME))
    return any(installed)


PATCH = Patch(
    NAME, "torch.cuda.current_stream()/default_stream()/Stream() need CUDA (DDP grad sync)", apply
)
