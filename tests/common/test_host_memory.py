"""`common/host_memory.keep_freed_memory`: the memory a step frees is reused by the next steps
instead of being handed back to the kernel and faulted in afresh (page faults as the kernel
counts them), and a user's own malloc settings are left alone."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="the policy sets glibc's malloc")

# a training step's mix of tensor sizes, in MiB (activations, gradients, temporaries)
STEP_MIB = [4, 25, 12, 5, 48, 2, 8, 12, 25, 4] * 4
STEP_PAGES = sum(STEP_MIB) * (1 << 20) // 4096
CHILD = """
import resource, sys, torch
from megatron_biglm.common import host_memory
applied = host_memory.keep_freed_memory() if sys.argv[1] == "on" else False
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
sizes = [int(m) << 18 for m in sys.argv[2].split(",")]  # float32 elements
per_step = []
for step in range(5):  # allocate a step's tensors (every page touched), free them all, again
    before = faults()
    held = [torch.ones(n) for n in sizes]
    del held
    per_step.append(faults() - before)
print(applied, sum(per_step[1:]))
"""


def _run(mode: str, **env) -> tuple[bool, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", CHILD, mode, ",".join(map(str, STEP_MIB))], env={**clean, **env}, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    return out[0] == "True", int(out[1])


def test_the_steps_after_the_first_reuse_its_memory():
    applied, faults = _run("on")
    assert applied
    assert faults < STEP_PAGES * 0.1, f"{faults} page faults in 4 steps after the first ({STEP_PAGES} pages a step)"
    # under glibc's defaults the same steps take much of their memory fresh from the kernel again
    _, default_faults = _run("off")
    assert default_faults >= STEP_PAGES * 0.5


@pytest.mark.parametrize("env", [{"MALLOC_ARENA_MAX": "2"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=100000"}])
def test_the_users_own_malloc_settings_win(env):
    applied, faults = _run("on", **env)
    assert not applied
    assert faults >= STEP_PAGES * 0.5  # glibc's behaviour, as the user configured it
