"""CPU shims under real model parallelism: TP=2 and PP=2 (2 gloo ranks via torchrun) train
through get_forward_backward_func + megatron DDP + get_megatron_optimizer and match the
unsplit model; without cpu_synchronize the PP=2 p2p exchange fails."""
from __future__ import annotations

import pytest
import torch

from no_cuda import torch_no_cuda_errors
from torchrun_util import run_function

THIS = "tests/patches/test_patches_cpu_parallel.py"

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-shim tests")


def layouts_worker(layouts, skip=()):
    """Train 2 steps in each (name, tp, pp, distributed_optimizer) layout on this rank.

    For TP layouts also records draws inside megatron's model-parallel RNG fork and on the
    default stream, right after seeding (what dropout would see)."""
    from megatron_biglm import patches
    import patches_fixtures as fx
    from megatron.core import tensor_parallel

    patches.apply_cpu(force=True, skip=skip)
    out = {}
    for name, tp, pp, distopt in layouts:
        fx.init_parallel(tp, pp)
        if tp > 1:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                in_fork = torch.rand(4).tolist()
            out[name + "_rng"] = {"in_fork": in_fork, "default": torch.rand(4).tolist()}
        model, optimizer = fx.build_training(fx.tiny_config(tp, pp), distopt)
        out[name] = fx.train_steps(model, optimizer, range(2))
    return out


@pytest.mark.slow
def test_tp2_pp2_and_sharded_optimizer_match_unsplit_training():
    layouts = [
        ["dp2", 1, 1, False],  # both ranks see the same data: the unsplit model's step
        ["tp2", 2, 1, False],
        ["pp2", 1, 2, False],
        ["dp2_distopt", 1, 1, True],
    ]
    res = run_function(f"{THIS}:layouts_worker", nproc=2, kwargs={"layouts": layouts}, timeout=300)
    res.check()
    reference = res.results[0]["dp2"]
    assert all(abs(x - reference["losses"][0]) < 1.0 for x in reference["losses"])
    for rank in (0, 1):
        for name, *_ in layouts:
            got = res.results[rank][name]
            # PP: only the last stage (rank 1) computes the loss.
            expect_loss = not (name == "pp2" and rank == 0)
            for step in range(2):
                if expect_loss:
                    assert got["losses"][step] == pytest.approx(
                        reference["losses"][step], rel=1e-6
                    ), (name, rank, step)
                else:
                    assert got["losses"][step] is None
                assert got["grad_norms"][step] == pytest.approx(
                    reference["grad_norms"][step], rel=1e-5
                ), (name, rank, step)
    # The step changed the model: step 2's loss is on new weights, not step 1's.
    assert reference["losses"][0] != reference["losses"][1]

    # CPU RNG tracker under TP=2: tensor-parallel dropout streams differ per TP rank and are
    # megatron's seeds (seed + 2718 + tp_rank); the replicated default stream is identical.
    rng0, rng1 = res.results[0]["tp2_rng"], res.results[1]["tp2_rng"]
    assert rng0["in_fork"] != rng1["in_fork"]
    assert rng0["default"] == rng1["default"]
    for tp_rank, rng in ((0, rng0), (1, rng1)):
        gen = torch.Generator().manual_seed(1234 + 2718 + tp_rank)
        assert rng["in_fork"] == torch.rand(4, generator=gen).tolist()


def test_without_cpu_synchronize_pp2_p2p_fails():
    res = run_function(
        f"{THIS}:layouts_worker", nproc=2,
        kwargs={"layouts": [["pp2", 1, 2, False]], "skip": ["cpu_synchronize"]}, timeout=180,
    )
    assert res.returncode != 0 and not res.timed_out
    assert any(f"{kind}: {text}" in res.output for kind, text in torch_no_cuda_errors()), res.output[-3000:]
    assert "p2p_communication.py" in res.output
