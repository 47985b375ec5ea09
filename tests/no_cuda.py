"""The failure a CUDA call raises on a machine without a GPU, whichever torch build is installed."""
from __future__ import annotations

import functools
import json
import subprocess
import sys
import textwrap

_PROBE = textwrap.dedent("""
    import json, os, torch
    calls = {
        "current_device": torch.cuda.current_device,
        "get_rng_state": torch.cuda.get_rng_state,
        "Stream()": torch.cuda.Stream,
        "Stream(cuda)": lambda: torch.cuda.Stream(device="cuda"),
        "synchronize": torch.cuda.synchronize,
        "empty(cuda)": lambda: torch.empty(1, device="cuda"),
    }
    seen = []
    for name, call in calls.items():
        for first in (True, False):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                out = None
                try:
                    if not first:
                        try:
                            torch.cuda.current_device()
                        except Exception:
                            pass
                    call()
                except Exception as exc:
                    out = [type(exc).__name__, str(exc).splitlines()[0]]
                os.write(write, json.dumps(out).encode())
                os._exit(0)
            os.close(write)
            data = b"".join(iter(lambda: os.read(read, 65536), b""))
            os.waitpid(pid, 0)
            if json.loads(data):
                seen.append(json.loads(data))
    print(json.dumps(seen))
""")


@functools.lru_cache(maxsize=None)
def torch_no_cuda_errors() -> frozenset:
    """(type, first line) of what this torch build raises for CUDA calls on a machine without a
    GPU: the CPU build's AssertionError ("Torch not compiled with CUDA enabled"), the CUDA
    build's RuntimeError ("Found no NVIDIA driver ...", "invalid argument to exchangeDevice")
    or AcceleratorError, by entry point. A CUDA build answers the first CUDA call of a process
    differently from later ones, so each call is made both first and after another, each in a
    fresh child of a fresh interpreter. The tests compare megatron's failure with this
    reference, whichever build is installed and whatever the test process did before."""
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return frozenset(tuple(e) for e in json.loads(proc.stdout.strip().splitlines()[-1]))
