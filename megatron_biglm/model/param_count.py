"""Parameter counts from the config alone, named like the megatron model's state dict.

Why not allocate and count: the 3.5B preset is 14 GB in fp32, and capacity planning happens on
machines that cannot hold it. A test checks these numbers against a real tiny model's
`named_parameters()`, so the formula and the model cannot drift apart.
"""
from __future__ import annotations

from collections import OrderedDict

from .config import BiGLMModelConfig


def layer_param_shapes(cfg: BiGLMModelConfig) -> "OrderedDict[str, tuple[int, ...]]":
    """Shapes of one transformer layer's parameters (TP=1), keyed by name inside the layer."""
    h, d, f = cfg.hidden_size, cfg.head_dim, cfg.ffn_hidden_size
    qkv_rows = (cfg.num_attention_heads + 2 * cfg.query_groups) * d
    return OrderedDict(
        [
            ("input_layernorm.weight", (h,)),
            ("self_attention.linear_qkv.weight", (qkv_rows, h)),
            ("self_attention.linear_proj.weight", (h, cfg.num_attention_heads * d)),
            ("pre_mlp_layernorm.weight", (h,)),
            ("mlp.linear_fc1.weight", (2 * f, h)),  # [gate; up]
            ("mlp.linear_fc2.weight", (h, f)),
        ]
    )


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def param_breakdown(cfg: BiGLMModelConfig) -> "OrderedDict[str, int]":
    """Unique parameters per component; the output layer is tied to the embedding (0 extra)."""
    per_layer = {name: _numel(shape) for name, shape in layer_param_shapes(cfg).items()}
    attention = per_layer["self_attention.linear_qkv.weight"] + per_layer["self_attention.linear_proj.weight"]
    mlp = per_layer["mlp.linear_fc1.weight"] + per_layer["mlp.linear_fc2.weight"]
    norms = per_layer["input_layernorm.weight"] + per_layer["pre_mlp_layernorm.weight"]
    return OrderedDict(
        [
            ("embedding (tied with output)", cfg.padded_vocab_size * cfg.hidden_size),
            ("attention (qkv + proj), all layers", attention * cfg.num_layers),
            ("mlp (fc1 gate/up + fc2), all layers", mlp * cfg.num_layers),
            ("norms (2 per layer + final)", norms * cfg.num_layers + cfg.hidden_size),
        ]
    )


def count_params(cfg: BiGLMModelConfig) -> int:
    """Total unique parameters of the model (tied embedding counted once)."""
    return sum(param_breakdown(cfg).values())


