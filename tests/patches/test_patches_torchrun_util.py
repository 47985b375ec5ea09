"""Self-test of tests/fixtures/torchrun_util.py: real gloo ranks, results, failures, timeouts."""
from __future__ import annotations

import time

import pytest

from torchrun_util import TorchrunFailed, run_function

THIS = "tests/patches/test_patches_torchrun_util.py"


def allreduce_worker(scale: int):
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(dist.get_rank() + 1) * scale])
    dist.all_reduce(value)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": value.item()}


def failing_worker():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("deliberate failure on rank 1")
    dist.barrier()  # rank 0 would wait forever; torchrun must stop it
    return "unreachable"


def sleeping_worker(seconds: float):
    time.sleep(seconds)
    return "woke"


def test_two_ranks_allreduce_and_results_per_rank():
    res = run_function(f"{THIS}:allreduce_worker", nproc=2, kwargs={"scale": 3}, timeout=120)
    res.check()
    # (1 + 2) * 3 summed on both ranks; each rank reports itself.
    assert res.results == {
        0: {"rank": 0, "world": 2, "sum": 9.0},
        1: {"rank": 1, "world": 2, "sum": 9.0},
    }


def test_failure_on_one_rank_is_reported_with_its_error_text():
    res = run_function(f"{THIS}:failing_worker", nproc=2, timeout=120)
    assert res.returncode != 0 and not res.timed_out
    assert "deliberate failure on rank 1" in res.output
    assert 1 not in res.results
    with pytest.raises(TorchrunFailed, match="deliberate failure on rank 1"):
        res.check()


def test_timeout_kills_the_job_and_is_reported():
    start = time.monotonic()
    res = run_function(f"{THIS}:sleeping_worker", nproc=1, kwargs={"seconds": 600}, timeout=5)
    assert res.timed_out
    assert time.monotonic() - start < 60  # killed, not waited out
    with pytest.raises(TorchrunFailed, match="timed out"):
        res.check()


def test_bad_target_is_a_clear_error():
    with pytest.raises(ValueError, match="file.py:function"):
        run_function("no_colon_here", nproc=1)
