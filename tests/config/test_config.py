"""The run config: YAML + overrides, type coercion, and fail-fast errors naming the key."""
from __future__ import annotations

import pytest
import yaml

from megatron_biglm.config import (ConfigError, check_batch_arithmetic, load_config,
                                            parse_override)


def _write(tmp_path, tree, name="run.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(tree))
    return path


def test_yaml_and_overrides_are_typed(tmp_path):
    path = _write(tmp_path, {"optimizer": {"lr": "6e-4"}, "schedule": {"train_steps": 100, "warmup_steps": 10}})
    cfg = load_config(path, ["optimizer.lr=3e-3", "training.micro_batch_size=8",
                             "optimizer.use_distributed_optimizer=true", "model.num_layers=2"])
    assert cfg.optimizer.lr == pytest.approx(3e-3) and isinstance(cfg.optimizer.lr, float)
    assert cfg.training.micro_batch_size == 8
    assert cfg.optimizer.use_distributed_optimizer is True
    assert cfg.model == {"preset": "tiny", "num_layers": 2}
    # YAML 1.1 reads 6e-4 as a string; the file value is coerced to float when not overridden.
    cfg2 = load_config(path)
    assert cfg2.optimizer.lr == pytest.approx(6e-4)


def test_unknown_key_names_key_and_suggests(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["optimizer.lrr=1"])
    msg = str(err.value)
    assert "optimizer.lrr" in msg and "did you mean 'lr'" in msg and "min_lr" in msg
    with pytest.raises(ConfigError, match="unknown config key 'trainig'"):
        load_config(_write(tmp_path, {"trainig": {"seed": 1}}))


@pytest.mark.parametrize("override,fragment", [
    ("training.micro_batch_size=abc", "expected int"),
    ("training.micro_batch_size=2.5", "expected int"),
    ("schedule.style=step", "not one of"),
    ("training.backend=jax", "not one of"),
    ("optimizer.use_distributed_optimizer=maybe", "true/false"),
    ("schedule.warmup_steps=500", "warmup_steps"),
    ("optimizer.min_lr=1", "exceeds"),
    ("training.global_batch_size=0", "must be > 0"),
    ("optimizer=3", "must be a mapping"),
    ("noequals", "section.key=value"),
])
def test_invalid_values_fail_with_key(override, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_config(None, ["schedule.train_steps=100", "schedule.warmup_steps=10", override])


def test_defaults_merge_and_ablation_override(tmp_path):
    _write(tmp_path, {"model": {"preset": "biglm_136m"}, "objective": {"alpha": 0.2},
                      "schedule": {"train_steps": 1000, "warmup_steps": 10}}, "base.yaml")
    child = _write(tmp_path, {"defaults": ["base.yaml"], "objective": {"alpha": 0.4}}, "child.yaml")
    cfg = load_config(child)
    assert cfg.objective == {"alpha": 0.4} and cfg.model["preset"] == "biglm_136m"
    assert cfg.schedule.train_steps == 1000


def test_wsd_anneal_start_and_decay_fraction():
    cfg = load_config(None, ["schedule.train_steps=300000", "schedule.warmup_steps=2000"])
    assert cfg.schedule.wsd_decay_steps == 60000 and cfg.anneal_start_step == 240000
    cfg = load_config(None, ["schedule.train_steps=50", "schedule.warmup_steps=5", "schedule.decay_steps=10"])
    assert cfg.anneal_start_step == 40
    with pytest.raises(ConfigError, match="fit after the warmup"):
        load_config(None, ["schedule.train_steps=50", "schedule.warmup_steps=45", "schedule.decay_steps=10"])


def test_a_sequence_longer_than_the_model_is_refused_before_the_run_is_built():
    """Checked where the run is prepared (the preset file is read there), naming both keys."""
    from megatron_biglm.config import check_sequence_fits

    for model_length in (64, 96, 512):
        fits = load_config(None, ["model.preset=tiny", f"model.seq_length={model_length}",
                                  f"data.seq_length={model_length}"])
        check_sequence_fits(fits)
        too_long = load_config(None, ["model.preset=tiny", f"model.seq_length={model_length}",
                                      f"data.seq_length={model_length + 1}"])  # loads: the model is read later
        with pytest.raises(ConfigError, match=rf"data.seq_length={model_length + 1} exceeds the model's maximum "
                                              rf"model.seq_length={model_length}; lower data.seq_length"):
            check_sequence_fits(too_long)


def test_resolved_config_roundtrips(tmp_path):
    cfg = load_config(None, ["schedule.train_steps=100", "schedule.warmup_steps=1", "optimizer.lr=1e-3"])
    path = _write(tmp_path, yaml.safe_load(cfg.to_yaml()))
    assert load_config(path) == cfg


def test_batch_arithmetic():
    cfg = load_config(None, ["training.global_batch_size=48", "training.micro_batch_size=4",
                             "schedule.train_steps=10", "schedule.warmup_steps=1"])
    assert check_batch_arithmetic(cfg, 3) == 4
    with pytest.raises(ConfigError, match=r"not divisible by .* 4 × 5 = 20"):
        check_batch_arithmetic(cfg, 5)


def test_parse_override_values():
    assert parse_override("data.blend=[[0.3, a], [0.7, b]]") == (["data", "blend"], [[0.3, "a"], [0.7, "b"]])
    assert parse_override("run_dir=runs/x") == (["run_dir"], "runs/x")


def test_env_expansion(monkeypatch):
    monkeypatch.setenv("BIGLM_TEST_DATA", "/data/fw")
    cfg = load_config(None, ["data.blend=['${BIGLM_TEST_DATA}/a_text_document']",
                             "data.tokenizer=${BIGLM_TEST_UNSET:-tok/default}"])
    assert cfg.data.blend == ["/data/fw/a_text_document"] and cfg.data.tokenizer == "tok/default"
    monkeypatch.delenv("BIGLM_TEST_DATA")
    with pytest.raises(ConfigError, match="BIGLM_TEST_DATA is not set"):
        load_config(None, ["data.tokenizer=${BIGLM_TEST_DATA}/tok"])


def test_model_and_objective_sections_are_typed_at_load():
    from megatron_biglm.objective import ObjectiveConfig

    cfg = load_config(None, ["objective.alpha=0.3", "objective.beta_y_range=[0.1, 0.9]", "model.norm_epsilon=1e-6",
                             "model.num_layers=2.0"])
    assert cfg.objective.resolved == ObjectiveConfig(alpha=0.3, beta_y_range=(0.1, 0.9))
    assert cfg.objective == {"alpha": 0.3, "beta_y_range": [0.1, 0.9]}  # what config.yaml keeps
    assert cfg.model == {"preset": "tiny", "norm_epsilon": 1e-6, "num_layers": 2}
    assert isinstance(cfg.model["num_layers"], int) and cfg.model.resolved.num_layers == 2
    assert cfg.model.resolved.hidden_size == 128  # the rest comes from the tiny preset
    with pytest.raises(ConfigError, match="unknown config key 'model.hiden_size' \\(did you mean 'hidden_size'\\?\\)"):
        load_config(None, ["model.hiden_size=64"])
    with pytest.raises(ConfigError, match="model.num_layers': expected int"):
        load_config(None, ["model.num_layers=two"])
    with pytest.raises(ConfigError, match="variant"):
        load_config(None, ["objective.variant=gpt"])
    with pytest.raises(ConfigError, match="objective.alpha': expected float"):
        load_config(None, ["objective.alpha=high"])


def test_bad_objective_key_fails_in_load_config_before_any_process_group(tmp_path, monkeypatch):
    import torch.distributed as dist

    from megatron_biglm.cli.train import train

    def refuse(*args, **kwargs):  # noqa: ARG001 - works whether or not an earlier test left a group up
        raise AssertionError("a process group was started before the config was checked")

    monkeypatch.setattr(dist, "init_process_group", refuse)
    was_up = dist.is_initialized()
    with pytest.raises(ConfigError) as err:
        train(None, [f"run_dir={tmp_path}", "schedule.train_steps=10", "schedule.warmup_steps=1",
                     "objective.lamda1=0.5"])
    msg = str(err.value)
    assert "'lamda1'" in msg and "did you mean 'lambda1'" in msg and "valid keys in objective" in msg
    assert dist.is_initialized() == was_up and not any(tmp_path.iterdir())  # nothing was started or written
