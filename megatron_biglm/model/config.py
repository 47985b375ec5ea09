"""`BiGLMModelConfig`: the architecture of one BiGLM model, independent of how it is parallelised.

Why a separate dataclass rather than megatron's `TransformerConfig`: presets, the parameter
counter and the HF exporter need the shape without megatron's ~300 runtime fields, and a typo
in a preset must fail naming the key. `to_transformer_config` adds the run-time choices
(parallel sizes, dtype, recompute, ...) and fixes everything BiGLM hard-wires: RMSNorm pre-norm,
SwiGLU, full RoPE, no biases; embeddings tied unless `untie_embeddings_and_output_weights`.

Choices documented here because the paper does not state them:
- `rotary_base` 10000: the RoPE default of the public Megatron-DeepSpeed reference and of
  SmolLM (v1), whose 136M/360M shapes Table 7 reuses.
- `norm_epsilon` 1e-5: SmolLM's `rms_norm_eps`.
- Output projections (attention `linear_proj`, MLP `linear_fc2`) use megatron-core's default
  scaled init, std / sqrt(2 * num_layers); everything else uses `init_method_std`.
- The vocabulary is padded up to a multiple of `make_vocab_size_divisible_by` (128), never
  depending on the tensor-parallel size, so checkpoints have one shape for every TP layout.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional, Union

import torch

from megatron_biglm.common.config_fields import ConfigError, build_dataclass
from megatron_biglm.common.mcore_internals import transformer_config_release_defaults
from megatron_biglm.model.attention_backends import check_backend_name
from megatron_biglm.model.shape import check_positive_ints, shape_kwargs, shape_of

#: `attention_compile` values: compile the flex kernel with torch.compile always, never, or
#: `auto` (on CUDA only; see `attention_params.resolve_compile`).
ATTENTION_COMPILE = ("auto", True, False)
#: `compile_layers` values: compile each transformer layer with torch.compile always, never, or
#: `auto` (when CUDA is available; see `layer_compile.compile_layers_on`).
COMPILE_LAYERS = ("auto", True, False)
#: `transformer_impl` values: the layers' linear and norm modules (see `layer_spec.resolve_transformer_impl`).
TRANSFORMER_IMPLS = ("auto", "local", "transformer_engine")
#: predicted rows per chunk of the fused loss (`loss.fused_linear_cross_entropy`): a `[chunk, vocab]`
#: fp32 block at a time. Here, not in loss.py, so the planner costs it without importing megatron-core.
FUSED_LOSS_CHUNK = 2048

_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}


class ModelConfigError(ConfigError):
    """A model config value or key is wrong; the message names it and the valid choices."""


@dataclass(frozen=True)
class BiGLMModelConfig:
    """Shape and regularisation of a BiGLM encoder (Table 7 of the paper; see presets)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    vocab_size: int
    num_query_groups: Optional[int] = None  # None = multi-head attention (groups = heads)
    seq_length: int = 2048  # max sequence length (RoPE tables are built up to this)
    init_method_std: float = 0.02
    rotary_base: float = 10000.0
    norm_epsilon: float = 1e-5
    hidden_dropout: float = 0.0  # the paper's final models drop dropout (Table 2)
    attention_dropout: float = 0.0
    attention_backend: str = "auto"
    # Whether the flex backend's kernel is compiled (torch.compile, fused, no s x s scores) or
    # run eagerly (materialises the scores). `auto` compiles on CUDA only: on CPU a compile
    # costs seconds per sequence shape, which short evaluation runs do not win back. `true`
    # compiles on CPU too (inductor's CPU flex kernel; forward only in torch 2.13, which has
    # no FlexAttention backward on CPU). Other backends are unaffected.
    attention_compile: Union[bool, Literal["auto"]] = "auto"
    # Regional compilation: each transformer layer's forward through torch.compile (one
    # compiled graph reused by every layer, as torchtitan does), so RMSNorm, RoPE, SwiGLU and
    # the residual adds fuse. `auto` compiles where CUDA is available; on CPU a compile costs
    # tens of seconds that a short run does not win back. Weights and state dict unchanged.
    compile_layers: Union[bool, Literal["auto"]] = "auto"
    # The modules a layer's linears and norms are built from: `local` (megatron-core's own and
    # our RMSNorm, on every machine), `transformer_engine` (TE's fused norm + linear, FP8-ready;
    # needs the package and CUDA), `auto` (TE where it imports and CUDA is present, else local).
    # Checkpoints interchange: the local layout stores its norms under TE's names.
    transformer_impl: str = "auto"
    make_vocab_size_divisible_by: int = 128
    # False (BiGLM's own models): the output projection IS the input embedding. True: a
    # separate `output_layer.weight` [padded vocab, h] (public EuroBERT checkpoints have an
    # untied lm_head); megatron-lm's `--untie-embeddings-and-output-weights`, the inverse of
    # GPTModel's `share_embeddings_and_output_weights`.
    untie_embeddings_and_output_weights: bool = False
    # CMLM length head (heads.py `length`): classifies the target length 0..length_head_max from
    # the mean-pooled prefix; 0 = no head (the model and its state dict are unchanged).
    length_head_max: int = 0
    name: Optional[str] = None  # informational (preset name)

    def __post_init__(self):
        check_positive_ints(self, ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
                                   "vocab_size", "seq_length", "make_vocab_size_divisible_by"),
                            lambda key, value: ModelConfigError(f"model.{key} must be a positive integer, got {value!r}"))
        if isinstance(self.length_head_max, bool) or not isinstance(self.length_head_max, int) \
                or self.length_head_max < 0:
            raise ModelConfigError(f"model.length_head_max must be an integer >= 0 (0: no length "
                                   f"head), got {self.length_head_max!r}")
        if self.num_query_groups is not None and (
            not isinstance(self.num_query_groups, int) or self.num_query_groups <= 0
        ):
            raise ModelConfigError(
                f"model.num_query_groups must be a positive integer or null, got {self.num_query_groups!r}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ModelConfigError(
                f"model.hidden_size {self.hidden_size} must be divisible by "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.query_groups:
            raise ModelConfigError(
                f"model.num_attention_heads {self.num_attention_heads} must be divisible by "
                f"num_query_groups {self.query_groups} (GQA shares one k/v head per group)"
            )
        if self.head_dim % 2:
            raise ModelConfigError(f"head dim {self.head_dim} must be even for rotary embeddings")
        for key in ("hidden_dropout", "attention_dropout"):
            value = getattr(self, key)
            if not (0.0 <= float(value) < 1.0):
                raise ModelConfigError(f"model.{key} must lie in [0, 1), got {value!r}")
        if float(self.init_method_std) <= 0 or float(self.norm_epsilon) <= 0:
            raise ModelConfigError("model.init_method_std and model.norm_epsilon must be positive")
        if float(self.rotary_base) <= 1:
            raise ModelConfigError(f"model.rotary_base must be > 1, got {self.rotary_base!r}")
        try:  # a registered name (or a module:Class), and one that can apply the attention dropout
            check_backend_name(self.attention_backend, float(self.attention_dropout))
        except ValueError as exc:
            raise ModelConfigError(f"model.attention_backend: {exc}") from None
        if self.attention_compile not in ATTENTION_COMPILE or not isinstance(self.attention_compile, (bool, str)):
            raise ModelConfigError(
                f"model.attention_compile must be auto, true or false, got {self.attention_compile!r}"
            )
        if self.compile_layers not in COMPILE_LAYERS or not isinstance(self.compile_layers, (bool, str)):
            raise ModelConfigError(
                f"model.compile_layers must be auto, true or false, got {self.compile_layers!r}"
            )
        if self.transformer_impl not in TRANSFORMER_IMPLS:
            raise ModelConfigError(
                f"model.transformer_impl {self.transformer_impl!r} is not one of {TRANSFORMER_IMPLS}")

    # ------------------------------------------------------------------ derived shape
    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def gated_mlp(self) -> bool:
        """BiGLM's MLP is SwiGLU (fc1 = [gate; up]): megatron's `gated_linear_unit`, and the
        MLP's third matrix that FLOP counts read from the shape."""
        return True

    @property
    def tie_word_embeddings(self) -> bool:
        """Whether the output projection is the input embedding (HF's name for the inverse of
        `untie_embeddings_and_output_weights`)."""
        return not self.untie_embeddings_and_output_weights

    @property
    def padded_vocab_size(self) -> int:
        """Embedding rows: vocab_size rounded up to `make_vocab_size_divisible_by`."""
        m = self.make_vocab_size_divisible_by
        return -(-self.vocab_size // m) * m

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "BiGLMModelConfig":
        """Build from a mapping (common.config_fields): values coerced to the field types,
        unknown keys fail naming the closest valid key, required keys must be present."""
        return build_dataclass(cls, values, "model", error=ModelConfigError)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **overrides) -> "BiGLMModelConfig":
        return self.from_dict({**self.to_dict(), **overrides})

    # ------------------------------------------------------------------ megatron
    def to_transformer_config(
        self,
        *,
        tensor_model_parallel_size: int = 1,
        pipeline_model_parallel_size: int = 1,
        params_dtype: "str | torch.dtype" = "fp32",
        sequence_parallel: bool = False,
        **overrides: Any,
    ):
        """A megatron-core `TransformerConfig` for this shape and the given parallel layout.

        `params_dtype` fp32/bf16/fp16 sets megatron's mixed-precision flags too. `overrides`
        are passed to TransformerConfig as they are (recompute, fusions, ...).
        """
        from megatron.core.transformer.transformer_config import TransformerConfig  # lazy: start-up (megatron.core: 2.9 CPU s)

        tp, pp = int(tensor_model_parallel_size), int(pipeline_model_parallel_size)
        self.check_parallel_layout(tp, pp)
        dtype = resolve_dtype(params_dtype)
        kwargs = dict(
            **shape_kwargs(shape_of(self), "megatron"),
            init_method_std=float(self.init_method_std),
            layernorm_epsilon=float(self.norm_epsilon),
            hidden_dropout=float(self.hidden_dropout),
            attention_dropout=float(self.attention_dropout),
            normalization="RMSNorm",
            activation_func=torch.nn.functional.silu,
            add_bias_linear=False,
            add_qkv_bias=False,
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            sequence_parallel=bool(sequence_parallel) and tp > 1,
            params_dtype=dtype,
            pipeline_dtype=dtype,
            bf16=dtype == torch.bfloat16,
            fp16=dtype == torch.float16,
            use_cpu_initialization=not torch.cuda.is_available(),
            attention_softmax_in_fp32=True,
            bias_dropout_fusion=False,
            masked_softmax_fusion=False,
            apply_rope_fusion=False,
            bias_activation_fusion=False,
            persist_layer_norm=False,
            gradient_accumulation_fusion=False,
            **transformer_config_release_defaults(),
        )
        kwargs.update(overrides)
        return TransformerConfig(**kwargs)

    def check_parallel_layout(self, tp: int, pp: int) -> None:
        """Fail early, with the fix, on layouts megatron would reject deep inside a constructor."""
        if tp < 1 or pp < 1:
            raise ModelConfigError(f"parallel sizes must be >= 1, got tp={tp} pp={pp}")
        problems = []
        if self.num_attention_heads % tp:
            problems.append(f"num_attention_heads {self.num_attention_heads}")
        if self.query_groups % tp:
            problems.append(f"num_query_groups {self.query_groups}")
        if self.ffn_hidden_size % tp:
            problems.append(f"ffn_hidden_size {self.ffn_hidden_size}")
        if self.padded_vocab_size % tp:
            problems.append(f"padded vocab {self.padded_vocab_size}")
        if problems:
            raise ModelConfigError(
                f"tensor parallel size {tp} must divide {', '.join(problems)}; "
                "choose a tensor_model_parallel_size that divides them"
            )
        if self.num_layers % pp:
            raise ModelConfigError(
                f"pipeline parallel size {pp} must divide num_layers {self.num_layers}"
            )


def resolve_dtype(dtype: "str | torch.dtype") -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ModelConfigError(f"unsupported params dtype {dtype}; use fp32, bf16 or fp16")
        return dtype
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ModelConfigError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}") from None
