"""`SHAPE_TABLE`: one map of a model's shape between our config, megatron-core and HF.

Round trips through the real `TransformerConfig` and `EuroBertConfig` for random valid shapes,
and the configs the table builds for every preset compared with the mapping written out here
field by field (independent of the table).
"""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_biglm.export.hf_config import (architecture_from_hf_config, eurobert_config,
                                             eurobert_config_class)
from megatron_biglm.model import BiGLMModelConfig, load_preset, preset_names
from megatron_biglm.model.shape import (SHAPE_SETTINGS, SHAPE_TABLE, BiGLMShape, config_settings,
                                        shape_from, shape_kwargs, shape_of)
from megatron_biglm.run.plan import START_MODEL_KEYS


@st.composite
def shapes(draw) -> BiGLMShape:
    groups = draw(st.integers(1, 8))
    heads = groups * draw(st.integers(1, 4))
    vocab = draw(st.integers(8, 5000))
    return BiGLMShape(
        num_layers=draw(st.integers(1, 48)), hidden_size=heads * draw(st.integers(1, 64)),
        num_attention_heads=heads, num_query_groups=groups, head_dim=2 * draw(st.integers(1, 96)),
        ffn_hidden_size=draw(st.integers(1, 8192)), vocab_size=vocab,
        padded_vocab_size=vocab + draw(st.integers(0, 127)),
        tie_word_embeddings=draw(st.booleans()), gated_mlp=draw(st.booleans()))


def _hf_config(shape: BiGLMShape):
    return eurobert_config(shape, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=64,
                           mask_token_id=0)


def test_the_table_names_real_fields_once():
    rows = [row.field for row in SHAPE_TABLE]
    assert sorted(rows) == sorted(f.name for f in dataclasses.fields(BiGLMShape))
    cfg = load_preset("tiny")
    hf = eurobert_config_class()()
    ours = {f.name for f in dataclasses.fields(BiGLMModelConfig)}
    megatron = {f.name for f in dataclasses.fields(TransformerConfig)}
    for row in SHAPE_TABLE:
        assert hasattr(cfg, row.ours), row
        assert row.setting is None or row.setting in ours, row
        assert row.megatron is None or row.megatron in megatron, row
        assert row.hf is None or hasattr(hf, row.hf), row
    assert set(SHAPE_SETTINGS) <= ours and set(SHAPE_SETTINGS) <= set(START_MODEL_KEYS)


@settings(max_examples=60, deadline=None)
@given(shapes())
def test_shape_round_trips_through_hf(shape):
    config = _hf_config(dataclasses.replace(shape, gated_mlp=True))  # EuroBERT is always gated
    assert shape_from(config, "hf", padded_vocab_size=shape.padded_vocab_size) == \
        dataclasses.replace(shape, gated_mlp=True)
    back = architecture_from_hf_config(config, padded_vocab_size=shape.padded_vocab_size).shape
    assert back == dataclasses.replace(shape, gated_mlp=True)


@settings(max_examples=60, deadline=None)
@given(shapes())
def test_shape_round_trips_through_megatron(shape):
    config = TransformerConfig(**shape_kwargs(shape, "megatron"))
    given_fields = {"vocab_size": shape.vocab_size, "padded_vocab_size": shape.padded_vocab_size,
                    "tie_word_embeddings": shape.tie_word_embeddings}
    assert shape_from(config, "megatron", **given_fields) == shape


@pytest.mark.parametrize("name", preset_names())
def test_preset_configs_match_the_mapping_by_hand(name):
    cfg = load_preset(name).replace(untie_embeddings_and_output_weights=name == "tiny")
    heads, groups = cfg.num_attention_heads, cfg.num_query_groups or cfg.num_attention_heads
    head_dim = cfg.hidden_size // heads
    expected_hf = eurobert_config_class()(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.ffn_hidden_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=heads, num_key_value_heads=groups,
        head_dim=head_dim, hidden_act="silu", max_position_embeddings=cfg.seq_length,
        rms_norm_eps=cfg.norm_epsilon, rope_parameters={"rope_type": "default", "rope_theta": float(cfg.rotary_base)},
        tie_word_embeddings=not cfg.untie_embeddings_and_output_weights, attention_bias=False, mlp_bias=False,
        attention_dropout=0.0, use_cache=False, architectures=["EuroBertForMaskedLM"],
        pad_token_id=None, bos_token_id=None, eos_token_id=None, mask_token_id=0)
    built = eurobert_config(shape_of(cfg), rope_theta=cfg.rotary_base, rms_norm_eps=cfg.norm_epsilon,
                            max_position_embeddings=cfg.seq_length, mask_token_id=0)
    assert built.to_dict() == expected_hf.to_dict()

    tc = cfg.to_transformer_config()
    expected_megatron = dict(num_layers=cfg.num_layers, hidden_size=cfg.hidden_size, num_attention_heads=heads,
                             num_query_groups=groups, ffn_hidden_size=cfg.ffn_hidden_size, kv_channels=head_dim,
                             gated_linear_unit=True)
    assert {key: getattr(tc, key) for key in expected_megatron} == expected_megatron

    # and back: the settings that rebuild the config (an HF import) give the same shape
    rebuilt = BiGLMModelConfig(**config_settings(shape_of(cfg)),
                               make_vocab_size_divisible_by=cfg.make_vocab_size_divisible_by)
    assert shape_of(rebuilt) == shape_of(cfg)
    assert shape_from(built, "hf", padded_vocab_size=cfg.padded_vocab_size) == shape_of(cfg)


def test_a_side_the_table_lacks_is_refused():
    with pytest.raises(ValueError, match="side 'deepspeed'"):
        shape_from(load_preset("tiny"), "deepspeed")
