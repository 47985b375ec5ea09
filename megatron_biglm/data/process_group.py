"""single_process_group: a 1-process gloo group for building datasets outside a launcher.

megatron-core 0.16's dataset builder calls torch.distributed (barriers, ranks) while writing
its index cache, so tools, benchmarks and tests that build datasets in a plain process need a
trivial group. Launched training already has one; this is a no-op then.
"""
from __future__ import annotations

import contextlib
import os
import socket

import torch.distributed as dist


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def single_process_group():
    """Init a world-size-1 gloo group if none exists; destroy it on exit (only if we made it)."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()
