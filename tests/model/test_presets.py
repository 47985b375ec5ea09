"""Presets (Table 7), the config dataclass, and the allocation-free parameter counter."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron_biglm.model.config import BiGLMModelConfig, ModelConfigError
from megatron_biglm.model.param_count import count_params, layer_param_shapes
from megatron_biglm.model.presets import load_preset, preset_names, reference_training

REPO = Path(__file__).resolve().parents[2]

# (preset, nominal size in the name, layers, hidden, heads, kv heads, init std) from Table 7
TABLE7 = [
    ("136m", 136e6, 30, 576, 9, 3, 0.02),
    ("360m", 360e6, 32, 960, 15, 5, 0.02),
    ("1p3b", 1.3e9, 24, 2048, 32, 32, 0.013),
    ("3p5b", 3.5e9, 30, 2560, 20, 20, 0.013),
]


@pytest.mark.parametrize("name,nominal,layers,hidden,heads,kv,std", TABLE7)
def test_presets_follow_table7_and_match_their_names_within_3_percent(
    name, nominal, layers, hidden, heads, kv, std
):
    cfg = load_preset(name)
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.query_groups) == (
        layers, hidden, heads, kv)
    assert cfg.init_method_std == std and cfg.seq_length == 2048 and cfg.vocab_size == 49153
    assert cfg.padded_vocab_size == 49280  # SmolLM's 49,152 + <mask>, padded to 128
    assert abs(count_params(cfg) / nominal - 1) < 0.03
    ref = reference_training(name)
    assert (ref["global_batch_size"], ref["train_steps"], ref["lr"], ref["min_lr"], ref["decay_steps"]) == (
        1024, 300000, 6e-4, 6e-5, 60000)


def test_smollm_shaped_presets_match_the_published_smollm_counts():
    # reference_facts.md: with tied embeddings and vocab 49,152, about 134.5M and 361.8M;
    # the <mask> row and the padding to 49,280 add 128 * hidden.
    assert abs(count_params(load_preset("136m")) / 134.5e6 - 1) < 1e-3
    assert abs(count_params(load_preset("360m")) / 361.8e6 - 1) < 1e-3


def test_trial_and_tiny_presets_and_aliases():
    trial = load_preset("trial_124m")
    assert (trial.num_layers, trial.hidden_size, trial.num_attention_heads) == (12, 768, 12)
    assert abs(count_params(trial) / 124e6 - 1) < 0.03
    assert reference_training("trial_124m")["lr"] == 3e-3
    assert load_preset("1.3B") == load_preset("1p3b")
    assert {"tiny", "136m", "360m", "1p3b", "3p5b", "trial_124m"} <= set(preset_names())
    for name in preset_names():  # every preset is a valid megatron layout at TP=1, PP=1
        load_preset(name).check_parallel_layout(1, 1)


def test_count_params_equals_an_allocated_model(tmp_path):
    from model_fixtures import build_model, init_megatron

    init_megatron(1, 1)
    # vocab 8000 pads to 8064: the count must use the padded embedding, as the model does.
    for overrides in ({}, {"vocab_size": 8000, "num_query_groups": 4}):
        cfg = load_preset("tiny", {**overrides, "attention_backend": "sdpa"})
        model = build_model(cfg, seed=0)
        params = dict(model.named_parameters())
        assert sum(p.numel() for p in params.values()) == count_params(cfg)
        shapes = layer_param_shapes(cfg)
        for i in range(cfg.num_layers):
            for name, shape in shapes.items():
                assert tuple(params[f"decoder.layers.{i}.{name}"].shape) == shape
        assert tuple(params["embedding.word_embeddings.weight"].shape) == (cfg.padded_vocab_size, cfg.hidden_size)


def test_count_params_cli_prints_breakdown_then_the_bare_total(tmp_path):
    custom = tmp_path / "mine.yaml"
    custom.write_text((REPO / "examples/configs/presets/tiny.yaml").read_text().replace(
        "num_layers: 4", "num_layers: 6"))
    out = subprocess.run([sys.executable, "-m", "megatron_biglm.cli.count_params", str(custom)], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    cfg = load_preset(custom)
    assert cfg.num_layers == 6 and out[-1] == str(count_params(cfg))
    assert any("embedding" in line for line in out[:-1])
    bad = subprocess.run([sys.executable, "-m", "megatron_biglm.cli.count_params", "137m"], cwd=REPO,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "known presets" in bad.stderr and "136m" in bad.stderr


def test_config_rejects_unknown_and_inconsistent_values():
    base = load_preset("tiny").to_dict()
    with pytest.raises(ModelConfigError, match="did you mean 'hidden_size'"):
        BiGLMModelConfig.from_dict({**base, "hiden_size": 64})
    with pytest.raises(ModelConfigError, match="missing required"):
        BiGLMModelConfig.from_dict({k: v for k, v in base.items() if k != "vocab_size"})
    with pytest.raises(ModelConfigError, match="divisible by num_query_groups"):
        BiGLMModelConfig.from_dict({**base, "num_query_groups": 3})
    with pytest.raises(ModelConfigError, match="attention_backend"):
        BiGLMModelConfig.from_dict({**base, "attention_backend": "xformers"})
    with pytest.raises(ModelConfigError, match="must lie in"):
        BiGLMModelConfig.from_dict({**base, "hidden_dropout": 1.5})
    # YAML 1.1 reads 1e-5 as a string: it is coerced, a non-number is not.
    assert BiGLMModelConfig.from_dict({**base, "norm_epsilon": "1e-6"}).norm_epsilon == 1e-6
    with pytest.raises(ModelConfigError, match="must be a number"):
        BiGLMModelConfig.from_dict({**base, "num_layers": "four"})
    with pytest.raises(ModelConfigError, match="tensor parallel size 2 must divide num_attention_heads 9"):
        load_preset("136m").to_transformer_config(tensor_model_parallel_size=2)


def test_transformer_config_carries_the_architecture():
    tc = load_preset("360m").to_transformer_config(params_dtype="bf16")
    assert tc.normalization == "RMSNorm" and tc.gated_linear_unit and not tc.add_bias_linear
    assert tc.activation_func is torch.nn.functional.silu
    assert (tc.num_query_groups, tc.kv_channels, tc.ffn_hidden_size) == (5, 64, 2560)
    assert tc.bf16 and tc.params_dtype == torch.bfloat16
    assert tc.hidden_dropout == 0.0 and tc.attention_dropout == 0.0
