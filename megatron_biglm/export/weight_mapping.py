"""Megatron (TP=1 full state dict) <-> HF EuroBERT state dict, one tensor at a time.

BiGLM is exactly transformers' native `EuroBertForMaskedLM` (see `export/README` paragraph in
the lead's README), so export needs no remote code; only names and two layouts differ. Which
tensors map to which, and how, is ONE table (`weight_table.WEIGHT_TABLE`); both directions,
the name/shape listings and the key checks here are derived from it.

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

from megatron_biglm.model.shape import BiGLMShape
from .weight_table import (HF_EMBEDDING, MEGATRON_EMBEDDING, NORM_NAMINGS, WEIGHT_TABLE,
                           expand_table, fc1_from_hf, fc1_to_hf, qkv_from_hf, qkv_to_hf, sidecar_file)

__all__ = [
    "NORM_NAMINGS", "WeightMappingError", "ConversionReport", "qkv_to_hf", "qkv_from_hf",
    "fc1_to_hf", "fc1_from_hf", "hf_tensor_shapes", "megatron_tensor_shapes",
    "detect_norm_naming", "megatron_to_hf", "hf_to_megatron",
]

logger = logging.getLogger(__name__)

#: Megatron keys that carry no weights (TE/fp8 metadata, recomputed rotary buffers).
_MEGATRON_NON_WEIGHT_SUFFIXES = ("._extra_state", "rotary_pos_emb.inv_freq")

#: The output projection's names on each side: a tied model may still carry them as a copy.
_OUTPUT_PROJECTION = next(r for r in WEIGHT_TABLE if r.output_projection)
_MEGATRON_OUTPUT, = _OUTPUT_PROJECTION.megatron
_HF_OUTPUT, = _OUTPUT_PROJECTION.hf


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


# --------------------------------------------------------------------------- name tables


def hf_tensor_shapes(shape: BiGLMShape, table=None) -> Dict[str, Tuple[int, ...]]:
    """Every HF tensor name -> its shape, in the order `megatron_to_hf` yields them.

    Lets a writer plan safetensors shards before any tensor is loaded.
    """
    return {name: want for group in expand_table(shape, table=table)
            for name, want in zip(group.hf, group.hf_shapes)}


def megatron_tensor_shapes(shape: BiGLMShape, norm_naming: str = "local", table=None) -> Dict[str, Tuple[int, ...]]:
    """Every megatron (TP=1, all stages) tensor name -> its shape, in `hf_to_megatron` order."""
    _norm_names(norm_naming)
    return {name: want for group in expand_table(shape, norm_naming, table)
            for name, want in zip(group.megatron, group.megatron_shapes)}


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
                   report: ConversionReport | None = None, table=None) -> Iterator[Tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` for a full TP=1 megatron state dict (local or TE norm names).

    Keys are validated now (before iteration); tensors are read lazily, in layer order.
    `table`: the rows to map (None: `WEIGHT_TABLE`; a head model adds `head_table(...)`).
    """
    report = report if report is not None else ConversionReport()
    naming = detect_norm_naming(state.keys())
    expected = megatron_tensor_shapes(shape, naming, table)

    def ignorable(key: str) -> str | None:
        if key.endswith(_MEGATRON_NON_WEIGHT_SUFFIXES):
            return "no weights (_extra_state / rotary buffer)"
        if key == _MEGATRON_OUTPUT and shape.tie_word_embeddings:
            return "tied copy of the word embeddings"
        if sidecar_file(key):
            return f"a head EuroBERT cannot hold: exported to {sidecar_file(key)}"
        return None

    _check_keys(state.keys(), expected, ignorable, "megatron", report)
    return _stream(state, shape, naming, expected, report, to_hf=True, table=table)


def hf_to_megatron(state: Mapping[str, torch.Tensor], shape: BiGLMShape, *,
                   norm_naming: str = "local",
                   report: ConversionReport | None = None, table=None) -> Iterator[Tuple[str, torch.Tensor]]:
    """Yield ``(megatron_name, tensor)`` (TP=1, global layer numbers) for an HF EuroBERT state dict.

    Embedding rows are zero-padded from `vocab_size` to `padded_vocab_size`. Keys are validated
    now; tensors are read lazily.
    """
    report = report if report is not None else ConversionReport()
    expected = hf_tensor_shapes(shape, table)
    _norm_names(norm_naming)

    def ignorable(key: str) -> str | None:
        if key == _HF_OUTPUT and shape.tie_word_embeddings:
            return "tied copy of the word embeddings"
        return None

    _check_keys(state.keys(), expected, ignorable, "HF", report)
    return _stream(state, shape, norm_naming, expected, report, to_hf=False, table=table)


def _stream(state, shape, naming, expected, report, *, to_hf: bool, table=None):
    """Walk the table in order: read a row's inputs, yield its transformed outputs."""
    if to_hf and _MEGATRON_OUTPUT in report.ignored:
        _tied_copy_must_match(state, _MEGATRON_OUTPUT, MEGATRON_EMBEDDING, shape.vocab_size)
    if not to_hf and _HF_OUTPUT in report.ignored:
        _tied_copy_must_match(state, _HF_OUTPUT, HF_EMBEDDING, shape.vocab_size)
    for group in expand_table(shape, naming, table):
        sources, targets = (group.megatron, group.hf) if to_hf else (group.hf, group.megatron)
        transform = group.row.to_hf if to_hf else group.row.from_hf
        outputs = transform(tuple(_get(state, name, expected[name]) for name in sources), shape)
        yield from zip(targets, outputs)
        del outputs  # release this row's tensors before the next row's inputs are read
        report.converted += len(targets)
    logger.info("%s: %s", "megatron -> HF" if to_hf else "HF -> megatron", report.summary())
