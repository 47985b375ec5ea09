"""megatron DDP's communication settings (training/ddp_settings.py): `auto` per machine, the
combinations refused with their fix, and on CPU with gloo: overlapped gradient reduction and
parameter all-gather (DP=2, distributed optimizer, two micro-batches per rank) train exactly
like the non-overlapped run and save the same checkpoint; `check_for_nan_in_grad=true` makes a
NaN gradient fatal, where `auto` lets the non-finite-step guard skip the step."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from megatron_biglm.config import ConfigError, load_config
from megatron_biglm.training.ddp_settings import DDPSettings, ddp_config, resolve_ddp_settings
from train_fixtures import TrainData, loss_and_grad_norm, poisoned_train, tiny_overrides, train_data  # noqa: F401 (fixture)

DISTOPT = "optimizer.use_distributed_optimizer=true"
OVERLAP = {"training.overlap_grad_reduce": True, "training.overlap_param_gather": True}


def _sections(*overrides):
    """The `training:` section and `optimizer.use_distributed_optimizer` the settings read."""
    cfg = load_config(None, list(overrides))
    return cfg.training, cfg.optimizer.use_distributed_optimizer


def _settings(*overrides) -> DDPSettings:
    return resolve_ddp_settings(*_sections(*overrides))


def test_ddp_settings_auto_is_off_on_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _settings(DISTOPT) == DDPSettings(False, False, False)


def test_ddp_settings_auto_overlaps_with_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _settings(DISTOPT) == DDPSettings(True, True, False)
    assert _settings() == DDPSettings(True, False, False)  # no distributed optimizer: nothing to gather
    assert _settings(DISTOPT, "training.overlap_grad_reduce=false") == DDPSettings(False, False, False)


def test_ddp_settings_explicit_values_reach_megatron():
    ddp = ddp_config(*_sections(DISTOPT, "training.overlap_grad_reduce=true",
                                "training.overlap_param_gather=true", "training.check_for_nan_in_grad=true"))
    assert ddp.overlap_grad_reduce and ddp.overlap_param_gather and ddp.check_for_nan_in_grad
    assert ddp.use_distributed_optimizer and ddp.grad_reduce_in_fp32


@pytest.mark.parametrize("overrides,message", [
    (["training.overlap_param_gather=true", "training.overlap_grad_reduce=true"],
     "overlap_param_gather=true needs the distributed optimizer: set optimizer.use_distributed_optimizer=true"),
    ([DISTOPT, "training.overlap_param_gather=true", "training.overlap_grad_reduce=false"],
     "overlap_param_gather=true needs training.overlap_grad_reduce=true"),
])
def test_ddp_settings_refuse_what_megatron_cannot_do(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _settings(*overrides)


def test_ddp_settings_bad_value_is_a_config_error():
    with pytest.raises(ConfigError, match="training.overlap_grad_reduce"):
        load_config(None, ["training.overlap_grad_reduce=sometimes"])


def overlap_worker(tokenizer: str, prefix: str, root: str) -> dict:
    """Rank body: the same DP=2 run without and with both overlaps (2 micro-batches per rank)."""
    from megatron_biglm.cli.train import train

    data, out = TrainData(tokenizer, prefix), {}
    for name, extra in {"plain": {}, "overlap": OVERLAP}.items():
        run = Path(root) / name
        result = train(None, tiny_overrides(data, run, steps=6, **extra, **{
            "optimizer.use_distributed_optimizer": True, "training.global_batch_size": 16}))
        out[name] = {"steps": sorted([s, *v] for s, v in loss_and_grad_norm(run).items()),
                     "checkpoint": result.checkpoint}
    return out


@pytest.mark.slow
def test_ddp_overlap_dp2_trains_and_saves_like_no_overlap(train_data, tmp_path):  # noqa: F811
    from megatron_biglm.inference.loading import load_megatron_checkpoint
    from torchrun_util import run_function

    res = run_function("tests/training/test_ddp_settings.py:overlap_worker", nproc=2, timeout=600, kwargs={
        "tokenizer": train_data.tokenizer, "prefix": train_data.prefix, "root": str(tmp_path)})
    runs = res.check().results[0]
    assert len(runs["overlap"]["steps"]) == 6
    assert runs["overlap"]["steps"] == runs["plain"]["steps"]  # losses and grad norms, exactly
    # the step's parameter all-gather was left to the next forward: the checkpoint must still hold it
    plain, overlap = (load_megatron_checkpoint(runs[k]["checkpoint"]).model.state_dict() for k in ("plain", "overlap"))
    assert plain.keys() == overlap.keys()
    for key in plain:
        if torch.is_tensor(plain[key]):
            assert torch.equal(plain[key], overlap[key]), key


def _poison_step_2(step, loss):
    return loss * float("nan") if step == 2 else loss


def test_ddp_check_for_nan_in_grad(train_data, tmp_path):  # noqa: F811
    guarded = poisoned_train(None, tiny_overrides(train_data, tmp_path / "auto", steps=4), _poison_step_2)
    assert guarded.skipped_nonfinite == 1 and math.isfinite(guarded.last_loss)
    with pytest.raises(Exception, match="found NaN in local grad norm"):
        poisoned_train(None, tiny_overrides(train_data, tmp_path / "fatal", steps=4,
                                            **{"training.check_for_nan_in_grad": True}), _poison_step_2)
