"""Distributed-optimizer checkpoints (patches.apply_distopt_checkpoint_fixes): train 2 steps,
save with dist_checkpointing, load into a fresh model/optimizer, train 2 more — bit-identical
to 4 uninterrupted steps at world size 1 and 2 (DP=2, optimizer state sharded). Each of the
five fixes, left out alone, shows the failure it prevents.

The fixes are per optimizer instance (nothing global), so one torchrun job can run every
variant side by side; the CPU shims it needs are applied only inside those ranks."""
from __future__ import annotations

import pytest
import torch

from torchrun_util import run_function

THIS = "tests/test_patches_distopt_checkpoint.py"
FIXES = ("sharding_type", "init_empty_state", "load_no_grad", "restore_step", "unshare_step")

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU runs of the fixes")


def _adam_steps(optimizer):
    """Per-parameter AdamW step values, and how many distinct step tensors back them."""
    from patches.distopt_checkpoint import distributed_optimizers

    values, ids = [], set()
    for dist_opt in distributed_optimizers(optimizer):
        for group in dist_opt.optimizer.param_groups:
            for param in group["params"]:
                step = dist_opt.optimizer.state[param]["step"]
                values.append(float(step))
                ids.add(id(step))
    return {"values": sorted(set(values)), "num_params": len(values), "distinct_tensors": len(ids)}


def resume_worker(ckpt_root, variants):
    """For each variant (a list of fixes to leave out): 2 steps, save, fresh load, 2 steps."""
    import traceback
    from pathlib import Path

    import patches
    import patches_fixtures as fx
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from patches import DISTOPT_METADATA, apply_distopt_checkpoint_fixes

    patches.apply_cpu(force=True)

    def fresh():
        fx.init_parallel(1, 1)
        return fx.build_training(fx.tiny_config(), distributed_optimizer=True)

    model, optimizer = fresh()
    baseline = fx.train_steps(model, optimizer, range(4))
    baseline_params = fx.full_state(model)

    out = {"baseline": baseline}
    for skip in variants:
        name = "+".join(skip) or "all_fixes"
        ckpt_dir = Path(ckpt_root) / name
        if dist.get_rank() == 0:
            ckpt_dir.mkdir(parents=True)
        dist.barrier()
        result = {}
        try:
            model, optimizer = fresh()
            result["applied"] = apply_distopt_checkpoint_fixes(optimizer, skip=skip)
            result["first"] = fx.train_steps(model, optimizer, range(2))
            result["steps_at_save"] = _adam_steps(optimizer)
            state = {"model": model.module.sharded_state_dict()}
            state["optimizer"] = optimizer.sharded_state_dict(state["model"])  # fix 1 default
            dist_checkpointing.save(state, str(ckpt_dir))

            model, optimizer = fresh()
            apply_distopt_checkpoint_fixes(optimizer, skip=skip)
            state = {"model": model.module.sharded_state_dict()}
            state["optimizer"] = optimizer.sharded_state_dict(
                state["model"], is_loading=True, metadata=None if skip else DISTOPT_METADATA
            )
            loaded = dist_checkpointing.load(state, str(ckpt_dir))
            model.module.load_state_dict(loaded["model"])
            optimizer.load_state_dict(loaded["optimizer"])
            result["steps_after_load"] = _adam_steps(optimizer)
            result["second"] = fx.train_steps(model, optimizer, range(2, 4))
            result["steps_after_resume"] = _adam_steps(optimizer)
            params = fx.full_state(model)
            result["max_param_diff"] = max(
                max(abs(a - b) for a, b in zip(baseline_params[k], params[k])) for k in params
            )
        except Exception as exc:  # reported to the test, which asserts on it
            result["error_type"] = type(exc).__name__
            result["error"] = str(exc)
            result["trace"] = traceback.format_exc()[-1500:]
        out[name] = result
    return out


def _assert_bit_identical_resume(result, baseline):
    assert "error" not in result, result.get("trace")
    assert result["applied"] == list(FIXES)
    assert result["first"]["losses"] == baseline["losses"][:2]
    assert result["second"]["losses"] == baseline["losses"][2:]
    assert result["second"]["grad_norms"] == baseline["grad_norms"][2:]
    assert result["max_param_diff"] == 0.0
    assert result["steps_after_load"]["values"] == [2.0]
    assert result["steps_after_resume"]["values"] == [4.0]
    n = result["steps_after_resume"]["num_params"]
    assert result["steps_after_resume"]["distinct_tensors"] == n


@pytest.fixture(scope="module")
def ws1(tmp_path_factory):
    variants = [[]] + [[fix] for fix in FIXES]
    root = tmp_path_factory.mktemp("distopt_ws1")
    res = run_function(
        f"{THIS}:resume_worker", nproc=1, kwargs={"ckpt_root": str(root), "variants": variants},
        timeout=300,
    ).check()
    return res.results[0]


def test_resume_is_bit_identical_at_world_size_1(ws1):
    # The baseline itself moves: 4 distinct losses.
    assert len(set(ws1["baseline"]["losses"])) == 4
    _assert_bit_identical_resume(ws1["all_fixes"], ws1["baseline"])


@pytest.mark.slow
def test_resume_is_bit_identical_at_dp2_with_sharded_optimizer_state(tmp_path):
    res = run_function(
        f"{THIS}:resume_worker", nproc=2,
        kwargs={"ckpt_root": str(tmp_path), "variants": [[]]}, timeout=300,
    ).check()
    for rank in (0, 1):
        _assert_bit_identical_resume(res.results[rank]["all_fixes"], res.results[rank]["baseline"])
    # Each DP rank holds (and restored) only its shard of the optimizer state.
    total = res.results[0]["all_fixes"]["steps_after_resume"]["num_params"]
    assert 0 < total < 15  # 15 params in the tiny model; a shard holds fewer


def test_without_sharding_type_fix_save_raises_flattened_range(ws1):
    r = ws1["sharding_type"]
    assert r["error_type"] == "CheckpointingException"
    assert "flattened_range is not supported" in r["error"]


def test_without_init_empty_state_fix_loading_a_fresh_optimizer_asserts(ws1):
    r = ws1["init_empty_state"]
    assert r["error_type"] == "AssertionError"
    assert "assert len(steps) == 1" in r["trace"] and "distrib_optimizer.py" in r["trace"]


def test_without_load_no_grad_fix_load_raises_leaf_view_error(ws1):
    r = ws1["load_no_grad"]
    assert r["error_type"] == "RuntimeError"
    assert "a view of a leaf Variable that requires grad" in r["error"]


def test_without_restore_step_fix_adam_restarts_at_step_0(ws1):
    r = ws1["restore_step"]
    assert "error" not in r, r.get("trace")
    assert r["steps_at_save"]["values"] == [2.0]
    assert r["steps_after_load"]["values"] == [0.0]  # bias correction restarts
    assert r["second"]["losses"][0] == ws1["baseline"]["losses"][2]  # weights loaded fine
    assert r["max_param_diff"] > 1e-4  # but the resumed updates differ


def test_without_unshare_step_fix_step_advances_once_per_parameter(ws1):
    r = ws1["unshare_step"]
    assert "error" not in r, r.get("trace")
    assert r["steps_after_load"]["values"] == [2.0]
    assert r["steps_after_load"]["distinct_tensors"] == 1
    n = r["steps_after_resume"]["num_params"]
    assert r["steps_after_resume"]["values"] == [2.0 + 2 * n]  # not 4.0
    assert r["max_param_diff"] > 0.0
