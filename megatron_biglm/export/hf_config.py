"""BiGLM shape <-> transformers' native `EuroBertConfig`.

Why EuroBERT: it is exactly BiGLM (pre-norm RMSNorm, final norm, full RoPE, SwiGLU, GQA, no
biases, bidirectional, MLM head = final norm -> tied output projection with no transform), so
an exported directory loads with plain `AutoModelForMaskedLM.from_pretrained(dir)`, no remote
code. Import accepts any EuroBERT config of that exact architecture (a checkpoint that was
never ours, too) and refuses the variations BiGLM cannot express, with the reason.

Native EuroBERT needs transformers >= 5.3 (added 2026-03-04).
"""
from __future__ import annotations

from dataclasses import dataclass

from megatron_biglm.model.shape import BiGLMShape, shape_from, shape_kwargs, shape_of

MIN_TRANSFORMERS = "5.3.0"


class UnsupportedArchitecture(ValueError):
    """An HF config that BiGLM cannot represent exactly; the message says which field and why."""


def eurobert_config_class():
    """`transformers.EuroBertConfig`, or a clear error naming the transformers version needed."""
    try:
        from transformers import EuroBertConfig  # lazy: start-up (transformers: 0.7 CPU s)
    except ImportError as exc:  # pragma: no cover - depends on the installed transformers
        import transformers  # lazy: start-up (transformers: 0.7 CPU s)

        raise ImportError(
            f"transformers {transformers.__version__} has no native EuroBERT; BiGLM export needs "
            f"transformers>={MIN_TRANSFORMERS} (pip install 'transformers>={MIN_TRANSFORMERS}')") from exc
    return EuroBertConfig


def eurobert_config(shape: BiGLMShape, *, rope_theta: float, rms_norm_eps: float,
                    max_position_embeddings: int, mask_token_id: int,
                    pad_token_id: int | None = None, bos_token_id: int | None = None,
                    eos_token_id: int | None = None, dtype: str | None = None):
    """The `EuroBertConfig` of a BiGLM model with `shape` (ids come from its tokenizer).

    `mask_token_id` is required: the export is a masked LM, and EuroBERT's default (128002, a
    Llama-3 id) would point outside a BiGLM vocabulary.

    rope theta is always written explicitly: EuroBERT's own checkpoints use 250000, the class
    default is 10000, and a silent default would rotate every position wrongly.
    """
    config_class = eurobert_config_class()
    ids = {"pad_token_id": pad_token_id, "bos_token_id": bos_token_id,
           "eos_token_id": eos_token_id, "mask_token_id": mask_token_id}
    if mask_token_id is None:
        raise ValueError("mask_token_id is required: a BiGLM tokenizer must have a mask token "
                         "(megatron_biglm.data.tokenizer.load_tokenizer adds one)")
    for name, value in ids.items():
        if value is not None and not 0 <= value < shape.vocab_size:
            raise ValueError(f"{name}={value} is outside the vocabulary [0, {shape.vocab_size})")
    config = config_class(
        **shape_kwargs(shape, "hf"),
        hidden_act="silu",
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": float(rope_theta)},
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        use_cache=False,
        architectures=["EuroBertForMaskedLM"],
        # EuroBERT's class defaults are its Llama-3 tokenizer ids; never inherit those.
        **ids,
    )
    if dtype is not None:
        config.dtype = dtype
    return config


@dataclass(frozen=True)
class ImportedArchitecture:
    """What building a megatron BiGLM from an HF config needs besides tensor shapes."""

    shape: BiGLMShape
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int


def architecture_from_hf_config(config, *, padded_vocab_size: int | None = None) -> ImportedArchitecture:
    """Read an HF config (ours or a native EuroBERT), refusing anything BiGLM is not exactly."""
    model_type = getattr(config, "model_type", None)
    if model_type != "eurobert":
        raise UnsupportedArchitecture(
            f"model_type {model_type!r} is not supported for import: BiGLM is exactly the EuroBERT "
            "architecture (bidirectional, RoPE, SwiGLU, RMSNorm, GQA) and imports only "
            "model_type 'eurobert'")
    checks = {
        "hidden_act": (getattr(config, "hidden_act", None), "silu", "BiGLM's MLP is SwiGLU (silu gate)"),
        "attention_bias": (bool(getattr(config, "attention_bias", False)), False, "BiGLM has no biases"),
        "mlp_bias": (bool(getattr(config, "mlp_bias", False)), False,
                     "BiGLM has no biases (EuroBERT's mlp_bias also adds an lm_head bias)"),
    }
    rope = dict(getattr(config, "rope_parameters", None) or {})
    checks["rope_parameters.rope_type"] = (rope.get("rope_type", "default"), "default",
                                           "megatron BiGLM uses plain RoPE, no scaling")
    for field_name, (got, want, why) in checks.items():
        if got != want:
            raise UnsupportedArchitecture(f"{field_name}={got!r} is not supported (need {want!r}): {why}")
    if "rope_theta" not in rope:
        raise UnsupportedArchitecture("the config names no rope_theta; BiGLM needs it explicitly")
    shape = shape_from(config, "hf", padded_vocab_size=padded_vocab_size)
    return ImportedArchitecture(shape=shape, rope_theta=float(rope["rope_theta"]),
                                rms_norm_eps=float(config.rms_norm_eps),
                                max_position_embeddings=int(config.max_position_embeddings))


#: The mapping shape of our `BiGLMModelConfig`: model/shape.py's one constructor, under the
#: name export's callers know.
shape_from_biglm_config = shape_of


def hf_config_from_biglm(model_config, tokenizer, *, dtype: str | None = None):
    """The `EuroBertConfig` for our `BiGLMModelConfig` and the tokenizer it was trained with.

    Special-token ids come from `tokenizer`. The HF vocabulary is `model_config.vocab_size`;
    megatron's padding rows are not exported.
    """
    if len(tokenizer) > model_config.vocab_size:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is "
            f"{model_config.vocab_size}: this tokenizer does not belong to this model")
    ids = {f"{role}_token_id": getattr(tokenizer, f"{role}_token_id", None)
           for role in ("pad", "bos", "eos", "mask")}
    return eurobert_config(
        shape_from_biglm_config(model_config),
        rope_theta=model_config.rotary_base,
        rms_norm_eps=model_config.norm_epsilon,
        max_position_embeddings=model_config.seq_length,
        dtype=dtype,
        **ids,
    )
