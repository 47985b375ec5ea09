"""The megatron-core specs of a BiGLM layer and of a pipeline stage's block of layers.

A pre-norm block: RMSNorm -> self-attention (fused QKV column-parallel linear, RoPE applied by
megatron's SelfAttention, BiGLM core attention, row-parallel output projection) -> residual ->
RMSNorm -> SwiGLU MLP (fc1 = [gate; up], fc2; `mlp.BiGLMMLP`) -> residual. Biases, GLU and the activation are
set by the TransformerConfig (`BiGLMModelConfig.to_transformer_config`), not here.

`local` (the default where Transformer Engine is absent): megatron-core modules plus our RMSNorm,
so the parameter names are the same on every machine; `sharded_state_dict_keys_map` stores the
norms under Transformer Engine's fused names in distributed checkpoints, as megatron's own local
GPT spec does, so checkpoints interchange with TE-based layouts. `transformer_engine`: each
pre-norm is fused into the linear after it (TE's `LayerNormColumnParallelLinear` for QKV and
fc1, RMSNorm by the TransformerConfig), TE's row-parallel linears for the projections; the core
attention stays ours (the split rule), so every attention backend works with either.
"""
from __future__ import annotations

import importlib.util

import torch
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

from megatron_biglm import patches
from megatron_biglm.common.mcore_internals import mlp_submodule

from .core_attention import BiGLMCoreAttention
from .mlp import BiGLMMLP
from .rms_norm import BiGLMRMSNorm

TE_INSTALL_HINT = "pip install --no-build-isolation 'transformer-engine[pytorch]'"


def transformer_engine_available() -> bool:
    """Transformer Engine imports here and a CUDA device runs it."""
    return importlib.util.find_spec("transformer_engine") is not None and torch.cuda.is_available()


def resolve_transformer_impl(value: str) -> str:
    """`local` or `transformer_engine` for `model.transformer_impl`; ValueError naming the
    package when `transformer_engine` is asked for where it cannot run. `auto` is `local`: the
    Transformer Engine layout is taken only when asked for by name, until its GPU parity test
    (tests/model/test_transformer_impl.py, marked gpu) has passed on a device."""
    if value == "auto":
        return "local"
    if value == "transformer_engine" and not transformer_engine_available():
        where = "" if torch.cuda.is_available() else " and a CUDA device (this machine has none)"
        raise ValueError(f"model.transformer_impl=transformer_engine needs Transformer Engine{where}: "
                         f"{TE_INSTALL_HINT}; or set model.transformer_impl to auto or local")
    return value


def biglm_layer_spec(ffn_hidden_size: int | None = None, impl: str = "local") -> ModuleSpec:
    """Spec for one BiGLM transformer layer. ``ffn_hidden_size`` sizes the MLP (megatron-core
    0.19 asks for it explicitly; None takes the TransformerConfig's, with 0.19's warning).
    ``impl``: "local" or "transformer_engine" (resolved, see `resolve_transformer_impl`)."""
    patches.apply_mlp_subclass_notice()  # the MLP is BiGLMMLP, a subclass megatron 0.16 logs about per layer
    patches.apply_rope_one_pass()  # megatron's unfused RoPE copies q and k several times per pass
    patches.apply_row_linear_tp_group()  # its tp_group=None warning breaks a compiled layer's graph
    if impl == "transformer_engine":
        from megatron.core.extensions.transformer_engine import (  # lazy: optional (TE, gpu extra)
            TELayerNormColumnParallelLinear,
            TERowParallelLinear,
        )

        # each norm is fused into the linear after it; its weight is that linear's layer_norm_weight
        norm, column, row, keys_map = IdentityOp, TELayerNormColumnParallelLinear, TERowParallelLinear, {}
    else:
        norm, column, row = BiGLMRMSNorm, ColumnParallelLinear, RowParallelLinear
        keys_map = {"input_layernorm.": "self_attention.linear_qkv.layer_norm_",
                    "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_"}
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=norm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                # The mask is never causal; its content comes from BiGLMAttentionParams.
                params={"attn_mask_type": AttnMaskType.arbitrary},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=column,
                    core_attention=BiGLMCoreAttention,
                    linear_proj=row,
                    q_layernorm=IdentityOp,
                    k_layernorm=IdentityOp,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=norm,
            mlp=mlp_submodule(
                BiGLMMLP, MLPSubmodules(linear_fc1=column, linear_fc2=row),
                {} if ffn_hidden_size is None else {"ffn_hidden_size": int(ffn_hidden_size)}),
            mlp_bda=get_bias_dropout_add,
            sharded_state_dict_keys_map=keys_map,
        ),
    )


def biglm_block_spec(config, vp_stage=None, impl: str = "local") -> TransformerBlockSubmodules:
    """This pipeline stage's layers plus the final RMSNorm (megatron's default final norm for
    a bare layer spec is a WrappedTorchNorm, which rejects sequence parallelism)."""
    num_layers = get_num_layers_to_build(config, vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=[biglm_layer_spec(config.ffn_hidden_size, impl)] * num_layers,
                                      layer_norm=BiGLMRMSNorm)
