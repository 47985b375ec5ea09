"""BiGLM on megatron-core: config, presets, layer spec, model, provider, loss.

Entry points:
    model_provider(pre_process, post_process, config)   -> BiGLMModel (this rank's chunk)
    load_preset("136m")                                  -> BiGLMModelConfig
    BiGLMModelConfig.to_transformer_config(...)          -> megatron TransformerConfig
    count_params(cfg)                                    -> int, without allocating
    masked_lm_loss_func(loss_mask, output_tensor)        -> megatron schedule loss_func
    build_head("masked_lm") / HEADS                      -> heads on the final hidden states

Parameter names and layouts (TP=1, PP=1 state dict; L layers, h hidden, nq heads, ng query
groups, d = h / nq head dim, f FFN size, V padded vocab):

    embedding.word_embeddings.weight                   [V, h]   also the output projection (tied)
    decoder.layers.{i}.input_layernorm.weight          [h]      RMSNorm before attention
    decoder.layers.{i}.self_attention.linear_qkv.weight [(nq + 2*ng) * d, h]
    decoder.layers.{i}.self_attention.linear_proj.weight [h, nq * d]
    decoder.layers.{i}.pre_mlp_layernorm.weight        [h]      RMSNorm before the MLP
    decoder.layers.{i}.mlp.linear_fc1.weight           [2 * f, h]  rows [gate; up]
    decoder.layers.{i}.mlp.linear_fc2.weight           [h, f]
    decoder.final_layernorm.weight                     [h]
    (`*._extra_state` entries are empty megatron bookkeeping: skip them.)

- QKV rows are interleaved per query group: for g in 0..ng-1, the block of rows is
  [q heads g*(nq/ng) .. (g+1)*(nq/ng)-1 (each d rows), k head g (d rows), v head g (d rows)].
- MLP: out = fc2(silu(x @ gate.T) * (x @ up.T)) with gate = fc1[:f], up = fc1[f:].
- Norms: RMSNorm, y = x / sqrt(mean(x^2) + eps) * weight, eps = config.norm_epsilon.
- RoPE on all of each head's d dims, non-interleaved ("rotate_half": pairs (j, j + d/2)),
  inv_freq = rotary_base ** (-arange(0, d, 2) / d), positions 0..s-1; applied to q and k.
- Attention scale 1/sqrt(d); no biases anywhere; logits = final_norm(x) @ embedding.T.
- There is no MLM head transform (dense/activation/norm) between the final norm and the tied
  output projection.
- With PP > 1 the last stage also holds `output_layer.weight`, a synchronised copy of the
  embedding; it is not a separate parameter of the model.
- Vocabulary rows past the tokenizer's size (padding to a multiple of 128) exist in the
  embedding and take part in the softmax, as in megatron.

Heavy megatron imports are lazy: `python -m megatron_biglm.cli.count_params` only needs config and param_count.
"""
from __future__ import annotations

from .attention_backends import backend_names, register_backend
from .config import BiGLMModelConfig, ModelConfigError, resolve_dtype
from .param_count import count_params, param_breakdown
from .presets import load_preset, preset_names, reference_training
import importlib

_LAZY = {
    "BiGLMModel": ".biglm_model",
    "model_provider": ".provider",
    "as_model_config": ".provider",
    "biglm_layer_spec": ".layer_spec",
    "BiGLMCoreAttention": ".core_attention",
    "BiGLMAttentionParams": ".attention_params",
    "build_attention_params": ".attention_params",
    "resolve_backend": ".attention_params",
    "HEADS": ".heads",
    "HeadSpec": ".heads",
    "MaskedLMHead": ".heads",
    "PoolingHead": ".heads",
    "build_head": ".heads",
    "register_head": ".heads",
    "pool_hidden": ".pooling",
    "masked_lm_loss_func": ".loss",
    "sparse_prediction_loss": ".loss",
    "init_single_process": ".standalone",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "backend_names", "register_backend", "BiGLMModelConfig", "ModelConfigError", "resolve_dtype",
    "count_params", "param_breakdown", "load_preset", "preset_names", "reference_training",
    *_LAZY,
]
