"""Keep the host memory a training step frees in the process, for the next step to reuse.

Why: glibc's malloc hands freed memory back to the kernel eagerly. A block above its mmap
threshold (128 KiB at start, raised on the fly to at most 32 MiB) is a mapping of its own,
unmapped when freed, and the top of the heap is trimmed once 128 KiB of it is free. A training
step on the CPU frees and reallocates its activations, gradients and temporaries every step,
in sizes from KiBs to hundreds of MiBs, so each step takes much of its memory fresh from the
kernel, which zeroes every page on its first touch: kernel time on every step, the more so on a
virtual machine that returns free pages to its host. At BiGLM's 136M shape (batch 16, seq 128,
one thread) that was 50-70k page faults a step after the second, and 0 with this policy.

`keep_freed_memory()` sets malloc's mmap threshold to 1 GiB (blocks below it come from the
heap, where a freed block is reused) and its trim threshold to 2 GiB (free memory at the top of
the heap is kept up to that much). The cost is that the process keeps its peak memory: what a
step freed is not given back until the process ends, which is what a training process, running
step after step at that peak, wants. It does nothing where the C library is not glibc, and
nothing when the user has set malloc's own settings (any ``MALLOC_*`` variable, or
``glibc.malloc`` in ``GLIBC_TUNABLES``): theirs win.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

#: glibc's mallopt parameter numbers (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 1 << 30
TRIM_THRESHOLD = (1 << 31) - 1  # mallopt takes an int


def user_malloc_settings() -> list[str]:
    """The environment variables through which the user already tunes glibc's malloc."""
    names = [k for k in os.environ if k.startswith("MALLOC_")]
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        names.append("GLIBC_TUNABLES")
    return sorted(names)


def keep_freed_memory() -> bool:
    """Apply the policy above to this process; True when it was applied (glibc, no user
    settings), False when left as it was. Safe to call more than once."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or user_malloc_settings():
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
