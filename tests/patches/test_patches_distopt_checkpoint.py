"""Distributed-optimizer checkpoints (patches.apply_distopt_checkpoint_fixes): train 2 steps,
save with dist_checkpointing, load into a fresh model/optimizer, train 2 more — bit-identical
to 4 uninterrupted steps at world size 1 and 2 (DP=2, optimizer state sharded); with the
'fully_reshardable' format also across a layout change (TP=2 -> DP=2). Each fix, left out
alone, shows the failure it prevents.

The fixes are per optimizer instance (nothing global), so one torchrun job can run every
variant side by side; the CPU shims it needs are applied only inside those ranks."""
from __future__ import annotations

import pytest
import torch

from torchrun_util import run_function

THIS = "tests/patches/test_patches_distopt_checkpoint.py"
FIXES = (
    "sharding_type", "init_empty_state", "load_no_grad", "restore_step", "unshare_step",
    "reshardable_step",
)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU runs of the fixes")


def _adam_steps(optimizer):
    """Per-parameter AdamW step values, and how many distinct step tensors back them."""
    from megatron_biglm.patches.distopt_checkpoint import distributed_optimizers

    values, ids = [], set()
    for dist_opt in distributed_optimizers(optimizer):
        for group in dist_opt.optimizer.param_groups:
            for param in group["params"]:
                step = dist_opt.optimizer.state[param]["step"]
                values.append(float(step))
                ids.add(id(step))
    return {"values": sorted(set(values)), "num_params": len(values), "distinct_tensors": len(ids)}


def resume_worker(ckpt_root, variants):
    """For each variant: 2 steps, save, load into a fresh model/optimizer, 2 more steps.

    A variant is {"name", "skip": fixes to leave out, "sharding": None (the fix-1 default)
    or a megatron sharding type, "save_tp", "load_tp"}."""
    import traceback
    from pathlib import Path

    from megatron_biglm import patches
    import patches_fixtures as fx
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron_biglm.patches import DISTOPT_METADATA, apply_distopt_checkpoint_fixes

    patches.apply_cpu(force=True)

    def fresh(tp):
        fx.init_parallel(tp, 1)
        return fx.build_training(fx.tiny_config(tp), distributed_optimizer=True)

    model, optimizer = fresh(1)
    baseline = fx.train_steps(model, optimizer, range(2))
    params_at_2 = fx.full_state(model)
    more = fx.train_steps(model, optimizer, range(2, 4))
    baseline = {key: baseline[key] + more[key] for key in baseline}
    baseline_params = fx.full_state(model)

    def max_diff(reference, params):
        return max(max(abs(a - b) for a, b in zip(reference[k], params[k])) for k in params)

    out = {"baseline": baseline}
    for variant in variants:
        skip, sharding = variant.get("skip", []), variant.get("sharding")
        save_meta = None if sharding is None else {"distrib_optim_sharding_type": sharding}
        load_meta = DISTOPT_METADATA if save_meta is None and not skip else save_meta
        ckpt_dir = Path(ckpt_root) / variant["name"]
        if dist.get_rank() == 0:
            ckpt_dir.mkdir(parents=True)
        dist.barrier()
        result = {}
        try:
            model, optimizer = fresh(variant.get("save_tp", 1))
            result["applied"] = apply_distopt_checkpoint_fixes(optimizer, skip=skip)
            result["first"] = fx.train_steps(model, optimizer, range(2))
            result["steps_at_save"] = _adam_steps(optimizer)
            state = {"model": model.module.sharded_state_dict()}
            state["optimizer"] = optimizer.sharded_state_dict(state["model"], metadata=save_meta)
            dist_checkpointing.save(state, str(ckpt_dir))

            model, optimizer = fresh(variant.get("load_tp", 1))
            apply_distopt_checkpoint_fixes(optimizer, skip=skip)
            state = {"model": model.module.sharded_state_dict()}
            state["optimizer"] = optimizer.sharded_state_dict(
                state["model"], is_loading=True, metadata=load_meta
            )
            loaded = dist_checkpointing.load(state, str(ckpt_dir))
            model.module.load_state_dict(loaded["model"])
            optimizer.load_state_dict(loaded["optimizer"])
            result["steps_after_load"] = _adam_steps(optimizer)
            result["param_diff_at_load"] = max_diff(params_at_2, fx.full_state(model))
            result["second"] = fx.train_steps(model, optimizer, range(2, 4))
            result["steps_after_resume"] = _adam_steps(optimizer)
            result["max_param_diff"] = max_diff(baseline_params, fx.full_state(model))
        except Exception as exc:  # reported to the test, which asserts on it
            result["error_type"] = type(exc).__name__
            result["error"] = str(exc)
            result["trace"] = traceback.format_exc()[-1500:]
        out[variant["name"]] = result
    return out


def _assert_bit_identical_resume(result, baseline):
    assert "error" not in result, result.get("trace")
    assert result["applied"] == list(FIXES)
    assert result["first"]["losses"] == baseline["losses"][:2]
    assert result["second"]["losses"] == baseline["losses"][2:]
    assert result["second"]["grad_norms"] == baseline["grad_norms"][2:]
    assert result["param_diff_at_load"] == 0.0
    assert result["max_param_diff"] == 0.0
    assert result["steps_after_load"]["values"] == [2.0]
    assert result["steps_after_resume"]["values"] == [4.0]
    n = result["steps_after_resume"]["num_params"]
    assert result["steps_after_resume"]["distinct_tensors"] == n


@pytest.fixture(scope="module")
def ws1(tmp_path_factory):
    variants = (
        [{"name": "all_fixes"}, {"name": "fully_reshardable", "sharding": "fully_reshardable"}]
        + [{"name": fix, "skip": [fix]} for fix in FIXES if fix != "reshardable_step"]
        + [{"name": "reshardable_step", "skip": ["reshardable_step"],
            "sharding": "fully_reshardable"}]
    )
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


def test_resume_from_fully_reshardable_format_is_bit_identical(ws1):
    _assert_bit_identical_resume(ws1["fully_reshardable"], ws1["baseline"])


@pytest.mark.slow
def test_resume_at_dp2_and_across_a_tp2_to_dp2_layout_change(tmp_path):
    variants = [
        {"name": "all_fixes"},
        {"name": "tp2_to_dp2", "sharding": "fully_reshardable", "save_tp": 2, "load_tp": 1},
    ]
    res = run_function(
        f"{THIS}:resume_worker", nproc=2,
        kwargs={"ckpt_root": str(tmp_path), "variants": variants}, timeout=300,
    ).check()
    for rank in (0, 1):
        baseline = res.results[rank]["baseline"]
        _assert_bit_identical_resume(res.results[rank]["all_fixes"], baseline)
        # A different layout reduces in a different order: equal up to float rounding.
        resharded = res.results[rank]["tp2_to_dp2"]
        assert "error" not in resharded, resharded.get("trace")
        assert resharded["second"]["losses"] == pytest.approx(baseline["losses"][2:], rel=1e-6)
        # The first 2 steps ran at TP=2, whose different reduction order Adam magnifies on
        # near-zero-gradient entries (measured ~5e-6); a mis-mapped shard would be off by
        # about one update (lr 1e-2).
        assert resharded["param_diff_at_load"] < 1e-4
        assert resharded["max_param_diff"] < 1e-4
        assert resharded["steps_after_resume"]["values"] == [4.0]
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


def test_without_reshardable_step_fix_fully_reshardable_load_raises_keyerror(ws1):
    r = ws1["reshardable_step"]
    assert r["error_type"] == "KeyError" and r["error"] == "'step'"
    assert "_set_main_param_and_optimizer_states" in r["trace"]


class DistributedOptimizer:  # stands in for megatron's class (matched by name) in unit tests
    def __init__(self, adam):
        self.optimizer = adam


def _adam_pair(amsgrad: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(5, 3, generator=gen), torch.randn(7, generator=gen)]
    grads = [torch.randn_like(w) for w in weights]
    make = lambda: [torch.nn.Parameter(w.clone()) for w in weights]  # noqa: E731
    a, b = make(), make()
    opt_a = torch.optim.AdamW(a, lr=0.1, weight_decay=0.01, amsgrad=amsgrad)
    opt_b = torch.optim.AdamW(b, lr=0.1, weight_decay=0.01, amsgrad=amsgrad)
    return (a, opt_a), (b, opt_b), grads


@pytest.mark.parametrize("amsgrad", [False, True])
def test_init_empty_state_equals_torch_lazy_init(amsgrad):
    from megatron_biglm.patches.distopt_checkpoint import init_empty_adam_state

    (a, opt_a), (b, opt_b), grads = _adam_pair(amsgrad)
    assert init_empty_adam_state(DistributedOptimizer(opt_b)) == 2
    assert init_empty_adam_state(DistributedOptimizer(opt_b)) == 0  # already has state
    for _ in range(3):
        for params, opt in ((a, opt_a), (b, opt_b)):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step()
    for pa, pb in zip(a, b):
        assert torch.equal(pa, pb)
        assert set(opt_a.state[pa]) == set(opt_b.state[pb])
        for key in opt_a.state[pa]:
            assert torch.equal(opt_a.state[pa][key], opt_b.state[pb][key])


def test_unshare_then_restore_gives_each_param_its_own_saved_step():
    from megatron_biglm.patches.distopt_checkpoint import restore_adam_step, unshare_adam_step

    (params, adam), _, grads = _adam_pair(False)
    for p, g in zip(params, grads):
        p.grad = g
    adam.step()
    shared = torch.tensor(0.0)
    for p in params:
        adam.state[p]["step"] = shared  # what megatron's load leaves behind
    adam.param_groups[0]["step"] = 7
    wrapped = DistributedOptimizer(adam)
    assert unshare_adam_step(wrapped) == 1  # the second param gets its own copy
    assert restore_adam_step(wrapped) == 2
    steps = [adam.state[p]["step"] for p in params]
    assert [float(s) for s in steps] == [7.0, 7.0] and steps[0] is not steps[1]
    adam.step()
    assert [float(adam.state[p]["step"]) for p in params] == [8.0, 8.0]


def test_after_load_helper_sets_each_param_its_own_applied_step():
    from megatron_biglm.patches import distopt_after_load, distopt_before_load

    (params, adam), _, _ = _adam_pair(False)
    wrapped = DistributedOptimizer(adam)
    assert distopt_before_load(wrapped) == 2
    shared = torch.tensor(0.0)
    for p in params:
        adam.state[p]["step"] = shared
    assert distopt_after_load(wrapped, applied_steps=5) == 2
    steps = [adam.state[p]["step"] for p in params]
    assert [float(s) for s in steps] == [5.0, 5.0] and steps[0] is not steps[1]


def test_fixes_are_not_applied_without_a_torch_adam_distributed_optimizer(caplog):
    import logging
    import types

    from megatron_biglm.patches import apply_distopt_checkpoint_fixes

    plain = types.SimpleNamespace(chained_optimizers=[types.SimpleNamespace(optimizer=None)])
    with caplog.at_level(logging.INFO, logger="megatron_biglm.patches"):
        assert apply_distopt_checkpoint_fixes(plain) == []
    assert "not needed" in caplog.text
    with pytest.raises(ValueError, match="unknown distopt fix names"):
        apply_distopt_checkpoint_fixes(plain, skip=["no_such_fix"])


def test_apply_is_idempotent_per_optimizer():
    from megatron_biglm.patches import apply_distopt_checkpoint_fixes

    (_, adam), _, _ = _adam_pair(False)
    dist_opt = DistributedOptimizer(adam)
    dist_opt.sharded_state_dict = lambda model_sd, is_loading=False, **kw: kw
    dist_opt.load_state_dict = lambda state_dict: None
    first = apply_distopt_checkpoint_fixes(dist_opt, skip=["reshardable_step"])
    wrapped = dist_opt.sharded_state_dict
    assert apply_distopt_checkpoint_fixes(dist_opt) == first == [f for f in FIXES[:5]]
    assert dist_opt.sharded_state_dict is wrapped  # not wrapped twice
    # fix 1 fills the sharding type only when the caller chose none
    default = {"distrib_optim_sharding_type": "dp_reshardable"}
    assert dist_opt.sharded_state_dict({}) == {"metadata": default}
    chosen = {"distrib_optim_sharding_type": "fully_reshardable"}
    assert dist_opt.sharded_state_dict({}, metadata=chosen) == {"metadata": chosen}
