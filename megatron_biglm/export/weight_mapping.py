"""Megatron (TP=1 full state dict) <-> HF EuroBERT state dict, one tensor at a time.

BiGLM is exactly transformers' native `EuroBertForMaskedLM` (see `export/README` paragraph in
the lead's README), so export needs no remote code; only names and two layouts differ:

* QKV: megatron's `linear_qkv.weight` is interleaved per query group,
  ``[g0: q(r*d) k(d) v(d), g1: ..., ...]`` with r = heads per group; HF keeps separate
  ``q_proj`` (heads in group order), ``k_proj``, ``v_proj``.
* SwiGLU: megatron's `linear_fc1.weight` is ``[gate; up]``; HF has ``gate_proj``/``up_proj``.

Both directions are generators of ``(name, tensor)`` that look up only the inputs of the tensor
being produced, so a lazy mapping (safetensors, a dist-checkpoint loader) streams a 3.5B model
without ever holding two full copies. Key sets are checked before the first tensor is read:
missing and unknown names are errors; names skipped on purpose (`_extra_state`, a tied copy
of the embedding) are recorded in a `ConversionReport` and logged, never dropped silently.
No two outputs share storage (safetensors refuses that); the mapping is pure slicing and
concatenation, so HF -> megatron -> HF is bit-identical (and so is megatron -> HF -> megatron,
except the vocab padding rows, which come back as zeros).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, Mapping, Tuple

import torch

from .shape import BiGLMShape

logger = logging.getLogger(__name__)

#: Where megatron keeps the two pre-norm weights. The local spec (CPU, tests) has separate
#: RMSNorm modules; transformer-engine specs fuse them into the following linear layer.
NORM_NAMINGS: Dict[str, Tuple[str, str]] = {
    "local": ("input_layernorm.weight", "pre_mlp_layernorm.weight"),
    "te": ("self_attention.linear_qkv.layer_norm_weight", "mlp.linear_fc1.layer_norm_weight"),
}

#: Megatron keys that carry no weights (TE/fp8 metadata, recomputed rotary buffers).
_MEGATRON_NON_WEIGHT_SUFFIXES = ("._extra_state", "rotary_pos_emb.inv_freq")


class WeightMappingError(ValueError):
    """The state dict does not match the shape it is converted with; the message says how."""


@dataclass
class ConversionReport:
    """What a conversion did with every input key it did not map one-to-one."""

    converted: int = 0
    ignored: Dict[str, str] = field(default_factory=dict)  # input key -> why it was skipped

    def summary(self) -> str:
        return f"converted {self.converted} tensors, skipped {len(self.ignored)} input keys" + (
            f" ({', '.join(sorted(set(self.ignored.values())))})" if self.ignored else "")


# --------------------------------------------------------------------------- layouts


def qkv_to_hf(qkv: torch.Tensor, shape: BiGLMShape) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Megatron's per-group interleaved QKV weight -> (q_proj, k_proj, v_proj) weights."""
    r, d, g = shape.heads_per_group, shape.head_dim, shape.num_query_groups
    grouped = qkv.reshape(g, (r + 2) * d, qkv.shape[-1])
    q = grouped[:, : r * d].reshape(shape.q_size, -1).clone()
    k = grouped[:, r * d:(r + 1) * d].reshape(shape.kv_size, -1).clone()
    v = grouped[:, (r + 1) * d:].reshape(shape.kv_size, -1).clone()
    return q, k, v


def qkv_from_hf(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: BiGLMShape) -> torch.Tensor:
    """(q_proj, k_proj, v_proj) weights -> megatron's per-group interleaved QKV weight."""
    r, d, g = shape.heads_per_group, shape.head_dim, shape.num_query_groups
    cols = q.shape[-1]
    grouped = torch.cat(
        [q.reshape(g, r * d, cols), k.reshape(g, d, cols), v.reshape(g, d, cols)], dim=1)
    return grouped.reshape(g * (r + 2) * d, cols)


def fc1_to_hf(fc1: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Megatron's ``[gate; up]`` fc1 weight -> (gate_proj, up_proj) weights."""
    gate, up = torch.chunk(fc1, 2, dim=0)
    return gate.clone(), up.clone()


def fc1_from_hf(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """(gate_proj, up_proj) weights -> megatron's ``[gate; up]`` fc1 weight."""
    return torch.cat([gate, up], dim=0)


# --------------------------------------------------------------------------- name tables


def hf_tensor_shapes(shape: BiGLMShape) -> Dict[str, Tuple[int, ...]]:
    """Every HF tensor name -> its shape, in the order `megatron_to_hf` yields them.

    Lets a writer plan safetensors shards before any tensor is loaded.
    """
    h, s = shape.hidden_size, shape
    out: Dict[str, Tuple[int, ...]] = {"model.embed_tokens.weight": (s.vocab_size, h)}
    for i in range(s.num_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "self_attn.q_proj.weight"] = (s.q_size, h)
        out[p + "self_attn.k_proj.weight"] = (s.kv_size, h)
        out[p + "self_attn.v_proj.weight"] = (s.kv_size, h)
        out[p + "self_attn.o_proj.weight"] = (h, s.q_size)
        out[p + "post_attention_layernorm.weight"] = (h,)
        out[p + "mlp.gate_proj.weight"] = (s.ffn_hidden_size, h)
        out[p + "mlp.up_proj.weight"] = (s.ffn_hidden_size, h)
        out[p + "mlp.down_proj.weight"] = (h, s.ffn_hidden_size)
    out["model.norm.weight"] = (h,)
    if not s.tie_word_embeddings:
        out["lm_head.weight"] = (s.vocab_size, h)
    return out


def megatron_tensor_shapes(shape: BiGLMShape, norm_naming: str = "local") -> Dict[str, Tuple[int, ...]]:
    """Every megatron (TP=1, all stages) tensor name -> its shape, in `hf_to_megatron` order."""
    attn_norm, mlp_norm = _norm_names(norm_naming)
    h, s = shape.hidden_size, shape
    out: Dict[str, Tuple[int, ...]] = {"embedding.word_embeddings.weight": (s.padded_vocab_size, h)}
    for i in range(s.num_layers):
        p = f"decoder.layers.{i}."
        out[p + attn_norm] = (h,)
        out[p + "self_attention.linear_qkv.weight"] = (s.q_size + 2 * s.kv_size, h)
        out[p + "self_attention.linear_proj.weight"] = (h, s.q_size)
        out[p + mlp_norm] = (h,)
        out[p + "mlp.linear_fc1.weight"] = (2 * s.ffn_hidden_size, h)
        out[p + "mlp.linear_fc2.weight"] = (h, s.ffn_hidden_size)
    out["decoder.final_layernorm.weight"] = (h,)
    if not s.tie_word_embeddings:
        out["output_layer.weight"] = (s.padded_vocab_size, h)
    return out


def detect_norm_naming(keys) -> str:
    """'local' or 'te', from where layer 0's attention pre-norm weight lives."""
    keys = set(keys)
    found = [name for name, (attn_norm, _) in NORM_NAMINGS.items()
             if f"decoder.layers.0.{attn_norm}" in keys]
    if len(found) != 1:
        raise WeightMappingError(
            "cannot tell where the pre-attention RMSNorm weight of layer 0 is: expected exactly one "
            f"of {[f'decoder.layers.0.{a}' for a, _ in NORM_NAMINGS.values()]}, found {found}. "
            "Pass a full TP=1 megatron state dict (all pipeline stages, global layer numbers)"
            + _prefix_hint(keys))
    return found[0]


def _norm_names(norm_naming: str) -> Tuple[str, str]:
    if norm_naming not in NORM_NAMINGS:
        raise ValueError(f"norm_naming must be one of {sorted(NORM_NAMINGS)}, got {norm_naming!r}")
    return NORM_NAMINGS[norm_naming]


def _prefix_hint(keys) -> str:
    if keys and all(k.startswith("module.") for k in keys):
        return "; every key starts with 'module.': strip the DDP/Float16Module wrapper prefix first"
    return ""


def _check_keys(given, expected, ignorable: Callable[[str], str | None], side: str,
                report: ConversionReport) -> None:
    given = set(given)
    missing = [k for k in expected if k not in given]
    unknown = sorted(k for k in given - set(expected) if ignorable(k) is None)
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"{len(missing)} expected {side} tensors are missing (first: {missing[:4]})")
        if unknown:
            parts.append(f"{len(unknown)} {side} keys are not part of BiGLM (first: {unknown[:4]})")
        raise WeightMappingError(
            "; ".join(parts) + ". The checkpoint and the config disagree (layers, GQA groups, "
            "tied embeddings?) or this is not a BiGLM/EuroBERT checkpoint" + _prefix_hint(given))
    for k in sorted(given - set(expected)):
        report.ignored[k] = ignorable(k)


def _get(state: Mapping[str, torch.Tensor], name: str, want: Tuple[int, ...]) -> torch.Tensor:
    tensor = state[name]
    if tuple(tensor.shape) != tuple(want):
        raise WeightMappingError(
            f"{name} has shape {tuple(tensor.shape)} but the config implies {tuple(want)}: "
            "the config does not describe this checkpoint")
    return tensor


def _tied_copy_must_match(state, copy_name: str, embed_name: str, rows: int) -> None:
    """A tied model may still carry the output weight (megatron's last PP stage, some HF saves)."""
    copy, embed = state[copy_name], state[embed_name]
    if copy.shape[0] < rows or embed.shape[0] < rows or not torch.equal(copy[:rows], embed[:rows]):
        raise WeightMappingError(
            f"{copy_name} differs from {embed_name}, but the config ties input and output "
            "embeddings; convert with tie_word_embeddings=False or fix the checkpoint")


# --------------------------------------------------------------------------- directions


def megatron_to_hf(state: Mapping[str, torch.Tensor], shape: BiGLMShape, *,
                   report: ConversionReport | None = None) -> Iterator[Tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` for a full TP=1 megatron state dict (local or TE norm names).

    Keys are validated now (before iteration); tensors are read lazily, in layer order.
    """
    report = report if report is not None else ConversionReport()
    naming = detect_norm_naming(state.keys())
    expected = megatron_tensor_shapes(shape, naming)

    def ignorable(key: str) -> str | None:
        if key.endswith(_MEGATRON_NON_WEIGHT_SUFFIXES):
            return "no weights (_extra_state / rotary buffer)"
        if key == "output_layer.weight" and shape.tie_word_embeddings:
            return "tied copy of the word embeddings"
        return None

    _check_keys(state.keys(), expected, ignorable, "megatron", report)
    return _megatron_to_hf_stream(state, shape, naming, expected, report)


def _megatron_to_hf_stream(state, shape, naming, expected, report):
    attn_norm, mlp_norm = NORM_NAMINGS[naming]
    v = shape.vocab_size
    embed_name = "embedding.word_embeddings.weight"
    if "output_layer.weight" in report.ignored:
        _tied_copy_must_match(state, "output_layer.weight", embed_name, v)

    def get(name):
        return _get(state, name, expected[name])

    yield "model.embed_tokens.weight", get(embed_name)[:v].clone()
    for i in range(shape.num_layers):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        yield h + "input_layernorm.weight", get(m + attn_norm)
        q, k, val = qkv_to_hf(get(m + "self_attention.linear_qkv.weight"), shape)
        yield h + "self_attn.q_proj.weight", q
        yield h + "self_attn.k_proj.weight", k
        yield h + "self_attn.v_proj.weight", val
        yield h + "self_attn.o_proj.weight", get(m + "self_attention.linear_proj.weight")
        yield h + "post_attention_layernorm.weight", get(m + mlp_norm)
        gate, up = fc1_to_hf(get(m + "mlp.linear_fc1.weight"))
        yield h + "mlp.gate_proj.weight", gate
        yield h + "mlp.up_proj.weight", up
        yield h + "mlp.down_proj.weight", get(m + "mlp.linear_fc2.weight")
        report.converted += 9
    yield "model.norm.weight", get("decoder.final_layernorm.weight")
    report.converted += 2
    if not shape.tie_word_embeddings:
        yield "lm_head.weight", get("output_layer.weight")[:v].clone()
        report.converted += 1
    logger.info("megatron -> HF: %s", report.summary())


def hf_to_megatron(state: Mapping[str, torch.Tensor], shape: BiGLMShape, *,
                   norm_naming: str = "local",
                   report: ConversionReport | None = None) -> Iterator[Tuple[str, torch.Tensor]]:
    """Yield ``(megatron_name, tensor)`` (TP=1, global layer numbers) for an HF EuroBERT state dict.

    Embedding rows are zero-padded from `vocab_size` to `padded_vocab_size`. Keys are validated
    now; tensors are read lazily.
    """
    report = report if report is not None else ConversionReport()
    expected = hf_tensor_shapes(shape)
    _norm_names(norm_naming)

    def ignorable(key: str) -> str | None:
        if key == "lm_head.weight" and shape.tie_word_embeddings:
            return "tied copy of the word embeddings"
        return None

    _check_keys(state.keys(), expected, ignorable, "HF", report)
    return _hf_to_megatron_stream(state, shape, norm_naming, expected, report)


def _hf_to_megatron_stream(state, shape, norm_naming, expected, report):
    attn_norm, mlp_norm = NORM_NAMINGS[norm_naming]
    if "lm_head.weight" in report.ignored:
        _tied_copy_must_match(state, "lm_head.weight", "model.embed_tokens.weight", shape.vocab_size)

    def get(name):
        return _get(state, name, expected[name])

    def pad_vocab(weight):
        extra = shape.padded_vocab_size - shape.vocab_size
        return torch.cat([weight, weight.new_zeros(extra, weight.shape[1])]) if extra else weight.clone()

    yield "embedding.word_embeddings.weight", pad_vocab(get("model.embed_tokens.weight"))
    for i in range(shape.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        yield m + attn_norm, get(h + "input_layernorm.weight")
        yield m + "self_attention.linear_qkv.weight", qkv_from_hf(
            get(h + "self_attn.q_proj.weight"), get(h + "self_attn.k_proj.weight"),
            get(h + "self_attn.v_proj.weight"), shape)
        yield m + "self_attention.linear_proj.weight", get(h + "self_attn.o_proj.weight")
        yield m + mlp_norm, get(h + "post_attention_layernorm.weight")
        yield m + "mlp.linear_fc1.weight", fc1_from_hf(
            get(h + "mlp.gate_proj.weight"), get(h + "mlp.up_proj.weight"))
        yield m + "mlp.linear_fc2.weight", get(h + "mlp.down_proj.weight")
        report.converted += 6
    yield "decoder.final_layernorm.weight", get("model.norm.weight")
    report.converted += 2
    if not shape.tie_word_embeddings:
        yield "output_layer.weight", pad_vocab(get("lm_head.weight"))
        report.converted += 1
    logger.info("HF -> megatron: %s", report.summary())
