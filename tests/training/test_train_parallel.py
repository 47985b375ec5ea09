"""World size 2 under torchrun (gloo): DP=2, TP=2 and PP=2 reproduce the world-size-1 loss
trajectory, and a distributed-optimizer checkpoint saved at DP=1 resumes at DP=2.

PP=2 initialises each stage's layers from the same seed, so its initial weights differ
from PP=1's (as in Megatron-LM); it therefore starts from the world-size-1 run's step-3
checkpoint, which also exercises resharding a checkpoint onto another pipeline layout."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_biglm.cli.train import train
from train_fixtures import tiny_overrides, train_data, train_records  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[2]
STEPS = 6


def _torchrun(overrides, timeout=240):
    from torchrun_util import free_port
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
           f"--master-port={free_port()}", "-m", "megatron_biglm.cli.train",
           "--config", str(REPO / "examples" / "configs" / "tiny_cpu.yaml"), *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    # the run's result line comes from the logging rank only, not once per rank
    results = [line for line in proc.stdout.splitlines() if line.startswith('{"result"')]
    assert len(results) == 1, proc.stdout[-5000:]


def _losses(run):
    return [r["loss"] for r in train_records(run).values()]


@pytest.fixture(scope="module")
def reference(train_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("ref") / "run"
    train(None, tiny_overrides(train_data, run, steps=STEPS, **{"checkpoint.save_interval": 3}))
    return {"losses": _losses(run), "ckpt3": run / "checkpoints" / "iter_0000003"}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["dp2", "tp2", "pp2"])
def test_world2_matches_world1(train_data, tmp_path, reference, layout):
    extra = {"tp2": {"parallelism.tensor_model_parallel_size": 2},
             "pp2": {"parallelism.pipeline_model_parallel_size": 2, "checkpoint.load": str(reference["ckpt3"])},
             "dp2": {}}[layout]
    _torchrun(tiny_overrides(train_data, tmp_path / "run", steps=STEPS, **extra))
    losses = _losses(tmp_path / "run")
    expected = reference["losses"][3:] if layout == "pp2" else reference["losses"]
    assert len(losses) == len(expected)
    assert losses == pytest.approx(expected, rel=1e-5, abs=1e-5), (losses, expected)
    assert losses[-1] < losses[0]


@pytest.mark.slow
def test_distopt_checkpoint_resumes_at_other_dp_size(train_data, tmp_path):
    extra = {"optimizer.use_distributed_optimizer": True, "checkpoint.save_interval": 3}
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(None, tiny_overrides(train_data, straight, steps=STEPS, **extra))
    train(None, tiny_overrides(train_data, split, steps=STEPS, **extra, **{"training.exit_after_steps": 3}))
    _torchrun(tiny_overrides(train_data, split, steps=STEPS, **extra))  # resumes at DP=2
    resumed = _losses(split)
    assert len(resumed) == STEPS
    assert resumed == pytest.approx(_losses(straight), rel=1e-5, abs=1e-5)
