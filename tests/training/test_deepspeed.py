"""The DeepSpeed backend (`training.backend: deepspeed`) on CPU/gloo.

ZeRO-2 at world size 1 learns, resumes bit-exactly (train 2N straight vs N, stop, resume to
2N: loss and grad norm identical at every step) and reproduces the megatron backend's loss
trajectory; NaN steps are skipped through DeepSpeed's overflow path; at DP=2 (torchrun) it
matches DP=1 and resumes; ZeRO-1 and ZeRO-3 + CPU offload follow the same trajectory.
Config and install errors are checked without deepspeed installed.
"""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from megatron_biglm.cli.train import train
from megatron_biglm.checkpoint.dirs import CheckpointError, complete_checkpoints, latest_checkpoint
from megatron_biglm.config import ConfigError, load_config
from megatron_biglm.training.nonfinite import TooManyNonFinite
from train_fixtures import loss_and_grad_norm, poisoned_train, tiny_overrides, train_data, train_records  # noqa: F401

STEPS = 8
DS = {"training.backend": "deepspeed", "training.deepspeed.zero_stage": 2}
# Checkpoints at 4 and 8, validation at 0, 4 and 8 (which must not change training:
# test_zero2_trains_the_same_without_validation) on 8 batches (64 windows), not one 8-window
# batch: the learning assertion below reads it.
RUN = {"checkpoint.save_interval": 4, "training.eval_interval": 4, "training.eval_iters": 8}
# The learning bars: 1/3 of the smallest drop measured over seeds (training.seed = data.seed =
# 1..5 and 1234, the megatron backend, which this test shows follows the same trajectory to 2e-5):
# step 1 -> 8 training loss dropped 0.66-0.83, the 64-window validation loss 0.734-0.754.
TRAIN_DROP_BAR = VAL_DROP_BAR = 0.2
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="deepspeed not installed: pip install 'megatron-biglm[deepspeed]'")


def _exported_weights(ckpt) -> dict:
    """The model as the exporter reads it (megatron_biglm.export: TP=1 names -> tensors)."""
    from megatron_biglm.config.trained_checkpoint import open_checkpoint

    weights = open_checkpoint(ckpt).weights()
    return {name: weights[name] for name in weights}


# ---------------------------------------------------------------- config and install (no deepspeed needed)
@pytest.mark.parametrize("override, message", [
    ("parallelism.tensor_model_parallel_size=2", r"data-parallel only, but parallelism is TP=2, PP=1"),
    ("parallelism.pipeline_model_parallel_size=2", r"data-parallel only, but parallelism is TP=1, PP=2"),
    ("optimizer.use_distributed_optimizer=true", r"set training.deepspeed.zero_stage instead"),
    ("training.deepspeed.offload_param=true", r"offload_param needs zero_stage=3 \(got 2\)"),
    ("training.deepspeed.zero_stage=4", r"'training.deepspeed.zero_stage': 4 is not one of \[1, 2, 3\]"),
    ("training.deepspeed.extra={train_batch_size: 64}", r"extra sets \['train_batch_size'\]"),
    ("training.deepspeed.extra={zero_optimization: {stage: 3}}", r"extra sets \['zero_optimization.stage'\]"),
])
def test_config_refuses_what_deepspeed_cannot_do(override, message):
    base = ["training.backend=deepspeed"]
    load_config(None, base)  # the defaults are valid
    with pytest.raises(ConfigError, match=message):
        load_config(None, base + [override])


def test_missing_deepspeed_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # makes `import deepspeed` raise ImportError
    with pytest.raises(ConfigError, match=r"pip install 'megatron-biglm\[deepspeed\]'.*training.backend=megatron"):
        train(None, ["training.backend=deepspeed"])


def test_deepspeed_config_comes_from_run_config():
    from megatron_biglm.training.deepspeed_backend import deepspeed_config

    cfg = load_config(None, ["training.backend=deepspeed", "training.micro_batch_size=3",
                             "training.global_batch_size=24", "optimizer.clip_grad=0.5",
                             "training.deepspeed.zero_stage=3", "training.deepspeed.offload_optimizer=true",
                             "training.deepspeed.offload_param=true",
                             "training.deepspeed.extra={zero_optimization: {overlap_comm: true}, "
                             "steps_per_print: 7}"])
    ds = deepspeed_config(cfg.training, cfg.optimizer, "fp32", num_microbatches=4)
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) \
        == (cfg.training.global_batch_size, cfg.training.micro_batch_size, 4)
    assert ds["gradient_clipping"] == cfg.optimizer.clip_grad
    # extra merges into the ZeRO section instead of replacing it
    assert ds["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                       "offload_param": {"device": "cpu"}, "overlap_comm": True}
    assert ds["steps_per_print"] == 7
    assert not ds["fp16"]["enabled"] and not ds["bf16"]["enabled"]  # fp32: no loss scaling at all
    assert deepspeed_config(cfg.training, cfg.optimizer, "bf16", 4)["bf16"]["enabled"]


def test_weight_decay_groups_follow_megatron():
    """Same no-decay rule as megatron's optimizer (its own predicate is the oracle)."""
    import torch
    from megatron.core.optimizer import OptimizerConfig, get_standard_config_overrides

    from megatron_biglm.training.deepspeed_backend import weight_decay_groups

    module = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 8), torch.nn.LayerNorm(8),
                                 torch.nn.Linear(8, 3, bias=False))
    (key, override), = get_standard_config_overrides(OptimizerConfig(lr=1.0)).items()
    assert override["wd_mult"] == 0.0
    expected_no_decay = {name for name, p in module.named_parameters() if key.matches(p, name)}
    groups = weight_decay_groups(module)
    names = {id(p): name for name, p in module.named_parameters()}
    got = {g["wd_mult"]: {names[id(p)] for p in g["params"]} for g in groups}
    assert got[0.0] == expected_no_decay and expected_no_decay  # biases and norm weights
    assert got[1.0] == {name for name, _ in module.named_parameters()} - expected_no_decay


# ---------------------------------------------------------------- training (deepspeed installed)
@pytest.fixture(scope="module")
def zero2_straight(train_data, tmp_path_factory):  # noqa: F811
    """ZeRO-2, world size 1, STEPS steps straight, validating at steps 0, 4, 8."""
    run = tmp_path_factory.mktemp("ds_straight") / "run"
    res = train(None, tiny_overrides(train_data, run, steps=STEPS, **DS, **RUN))
    return run, res


@pytest.mark.slow
@needs_deepspeed
def test_zero2_learns_resumes_exactly_and_matches_megatron(train_data, zero2_straight, tmp_path):  # noqa: F811
    straight, res = zero2_straight
    a = loss_and_grad_norm(straight)
    assert sorted(a) == list(range(1, STEPS + 1)) and res.skipped_nonfinite == 0
    assert a[STEPS][0] < a[1][0] - TRAIN_DROP_BAR, a  # learns real text
    assert res.last_val_loss < res.first_val_loss - VAL_DROP_BAR, (res.first_val_loss, res.last_val_loss)

    split = tmp_path / "split"
    extra = {**DS, **RUN}
    first = train(None, tiny_overrides(train_data, split, steps=STEPS, **extra, **{"training.exit_after_steps": 4}))
    assert first.iteration == 4
    second = train(None, tiny_overrides(train_data, split, steps=STEPS, **extra))
    assert second.resumed_from.endswith("iter_0000004") and second.iteration == STEPS
    assert loss_and_grad_norm(split) == a  # CPU fp32: bit for bit at every step
    assert second.last_val_loss == res.last_val_loss

    ckpt = latest_checkpoint(split / "checkpoints")  # manifest-verified, sealed by our scheme
    assert [p.name for p in complete_checkpoints(split / "checkpoints")] == ["iter_0000004", "iter_0000008"]
    state = json.loads((ckpt / "train_state.json").read_text())
    assert (state["backend"], state["zero_stage"], state["dp"]) == ("deepspeed", 2, 1)
    assert state["consumed_samples"] == STEPS * 8
    assert list((ckpt / "deepspeed" / "state").glob("*optim_states.pt"))

    # The megatron backend on the same config: same model, data, AdamW groups, clipping and lr.
    mega = tmp_path / "megatron"
    mres = train(None, tiny_overrides(train_data, mega, steps=STEPS, **RUN))
    m = loss_and_grad_norm(mega)
    assert m[1][0] == a[1][0] and mres.first_val_loss == res.first_val_loss  # same initial weights
    assert mres.last_val_loss == pytest.approx(res.last_val_loss, abs=2e-5)
    for step in a:
        assert a[step][0] == pytest.approx(m[step][0], abs=2e-5), (step, a[step], m[step])
        assert a[step][1] == pytest.approx(m[step][1], rel=1e-4), (step, a[step], m[step])

    # The exporter reads exactly the weights DeepSpeed trained (its own module file is the
    # reference; the exporter names tensors like a megatron checkpoint does).
    import torch
    ds_module = torch.load(ckpt / "deepspeed" / "state" / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    exported = _exported_weights(ckpt)
    assert set(exported) == set(_exported_weights(mega / "checkpoints" / "iter_0000008"))

    def by_content(tensors):
        return sorted(tensors, key=lambda t: (tuple(t.shape), float(t.double().sum())))
    mine = by_content(t for k, t in ds_module.items() if not k.endswith("_extra_state"))
    assert len(mine) == len(exported)
    assert all(torch.equal(x, y) for x, y in zip(mine, by_content(exported.values())))

    # A checkpoint resumes only with the backend that wrote it.
    with pytest.raises(CheckpointError, match=r"written by the deepspeed backend.*training.backend=deepspeed"):
        train(None, tiny_overrides(train_data, split, steps=STEPS + 2))
    with pytest.raises(CheckpointError, match=r"written by the megatron backend"):
        train(None, tiny_overrides(train_data, mega, steps=STEPS + 2, **DS))


@pytest.mark.slow
@needs_deepspeed
def test_zero2_trains_the_same_without_validation(train_data, zero2_straight, tmp_path):  # noqa: F811
    run = tmp_path / "quiet"
    quiet = {**RUN, "training.eval_interval": 0, "training.eval_iters": 0, "training.exit_after_steps": 4}
    res = train(None, tiny_overrides(train_data, run, steps=STEPS, **DS, **quiet))
    assert res.first_val_loss is None and zero2_straight[1].first_val_loss is not None
    straight = loss_and_grad_norm(zero2_straight[0])
    assert loss_and_grad_norm(run) == {step: straight[step] for step in (1, 2, 3, 4)}  # bit for bit


@pytest.mark.slow
@needs_deepspeed
def test_zero2_skips_nonfinite_steps_then_stops(train_data, zero2_straight, tmp_path):  # noqa: F811
    def poisoned(step, loss):
        return loss * math.nan if step == 3 or step >= 6 else loss

    run = tmp_path / "nan"
    with pytest.raises(TooManyNonFinite, match="2 steps in a row"):
        poisoned_train(None, tiny_overrides(train_data, run, steps=STEPS, **DS, **RUN,
                                            **{"training.max_nonfinite_in_a_row": 2}), poisoned)
    recs = train_records(run)
    straight = loss_and_grad_norm(zero2_straight[0])
    assert [recs[s]["loss"] for s in (1, 2)] == [straight[s][0] for s in (1, 2)]
    assert recs[3]["loss"] == "nan" and recs[3]["grad_norm"] == "nan" and recs[3]["skipped_nonfinite"] == 1
    # The skipped update left finite weights and AdamW state: training goes on normally.
    for s in (4, 5):
        assert math.isfinite(recs[s]["loss"]) and math.isfinite(recs[s]["grad_norm"]), recs[s]
    assert recs[6]["loss"] == "nan" and 7 not in recs  # stopped during step 7, nothing saved after 4
    assert latest_checkpoint(run / "checkpoints").name == "iter_0000004"


def dp2_worker(tokenizer: str, prefix: str, run_dir: str) -> dict:
    """Rank body under torchrun: stop at step 4, resume to STEPS in the same processes."""
    from train_fixtures import TrainData

    data = TrainData(tokenizer, prefix)
    first = train(None, tiny_overrides(data, Path(run_dir), steps=STEPS, **DS, **RUN,
                                       **{"training.exit_after_steps": 4}))
    second = train(None, tiny_overrides(data, Path(run_dir), steps=STEPS, **DS, **RUN))
    return {"first": first.iteration, "resumed_from": second.resumed_from, "last": second.iteration}


@pytest.mark.slow
@needs_deepspeed
def test_zero2_dp2_matches_dp1_and_resumes(train_data, zero2_straight, tmp_path):  # noqa: F811
    from torchrun_util import run_function

    run = tmp_path / "dp2"
    kwargs = {"tokenizer": train_data.tokenizer, "prefix": train_data.prefix, "run_dir": str(run)}
    res = run_function("tests/training/test_deepspeed.py:dp2_worker", nproc=2, timeout=300, kwargs=kwargs).check()
    assert all(r["first"] == 4 and r["last"] == STEPS and r["resumed_from"].endswith("iter_0000004")
               for r in res.results.values())
    dp2, dp1 = loss_and_grad_norm(run), loss_and_grad_norm(zero2_straight[0])
    assert sorted(dp2) == sorted(dp1)
    for step in dp1:  # DP=2 splits the same global batch over two ranks: only the sum order differs
        assert dp2[step][0] == pytest.approx(dp1[step][0], abs=2e-5), (step, dp2[step], dp1[step])
        assert dp2[step][1] == pytest.approx(dp1[step][1], rel=1e-4), (step, dp2[step], dp1[step])
    state = json.loads((latest_checkpoint(run / "checkpoints") / "train_state.json").read_text())
    assert state["dp"] == 2
    assert len(list((run / "checkpoints" / "iter_0000008" / "deepspeed" / "state").glob("*optim_states.pt"))) == 2
    with pytest.raises(CheckpointError, match=r"data-parallel size 2, this run has 1.*Launch 2 processes"):
        train(None, tiny_overrides(train_data, run, steps=STEPS + 2, **DS))


@pytest.mark.slow
@needs_deepspeed
@pytest.mark.parametrize("zero", [{"training.deepspeed.zero_stage": 1},
                                  {"training.deepspeed.zero_stage": 3, "training.deepspeed.offload_param": True,
                                   "training.deepspeed.offload_optimizer": True}], ids=["zero1", "zero3_offload"])
def test_other_zero_stages_follow_zero2(train_data, zero2_straight, tmp_path, zero):  # noqa: F811
    """Partitioning changes where state lives, not the math: 4 steps of the same run."""
    run = tmp_path / "run"
    train(None, tiny_overrides(train_data, run, steps=STEPS, **{**DS, **RUN, **zero, "training.exit_after_steps": 4}))
    got, ref = loss_and_grad_norm(run), loss_and_grad_norm(zero2_straight[0])
    assert sorted(got) == [1, 2, 3, 4]
    for step in got:
        assert got[step][0] == pytest.approx(ref[step][0], abs=2e-5), (step, got[step], ref[step])
        assert got[step][1] == pytest.approx(ref[step][1], rel=1e-4), (step, got[step], ref[step])
    ckpt = latest_checkpoint(run / "checkpoints")
    state = json.loads((ckpt / "train_state.json").read_text())
    assert state["zero_stage"] == zero["training.deepspeed.zero_stage"]
    # ZeRO-3 gathers its partitioned parameters for the exporter's copy of the model.
    got_w, ref_w = _exported_weights(ckpt), _exported_weights(zero2_straight[0] / "checkpoints" / "iter_0000004")
    assert set(got_w) == set(ref_w)
    for name in ref_w:
        assert got_w[name].shape == ref_w[name].shape, name
        assert (got_w[name] - ref_w[name]).abs().max() < 1e-5, name

