"""THE megatron <-> HF EuroBERT weight table: one row per group of tensors that map together.

Each row names its tensors on both sides and gives the transform for each direction; both
conversion directions, both name/shape listings and the key checks are derived from this table
(`weight_mapping.py`). A task head's rows are derived from its entry (`head_rows`).

Name patterns: ``{i}`` is the layer number (a row with it repeats for every layer, in table
order within the layer); ``{attn_norm}`` / ``{mlp_norm}`` are where megatron keeps the two
pre-norm weights (`NORM_NAMINGS`: separate RMSNorm modules in the local spec, fused into the
next linear layer in transformer-engine specs).

Two layouts differ between the sides:

* QKV: megatron's `linear_qkv.weight` is interleaved per query group,
  ``[g0: q(r*d) k(d) v(d), g1: ..., ...]`` with r = heads per group; HF keeps separate
  ``q_proj`` (heads in group order), ``k_proj``, ``v_proj``.
* SwiGLU: megatron's `linear_fc1.weight` is ``[gate; up]``; HF has ``gate_proj``/``up_proj``.

Vocabulary rows: megatron pads the embedding to `padded_vocab_size`; export drops the padding,
import zero-fills it. Transforms are pure slicing and concatenation (bit-exact both ways) and
never return a view of their input (safetensors refuses shared storage), except the identity,
which passes the input tensor through.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Sequence, Tuple

import torch

from megatron_biglm.model.heads import task_head
from megatron_biglm.model.shape import BiGLMShape

Tensors = Tuple[torch.Tensor, ...]
Shapes = Tuple[Tuple[int, ...], ...]

#: Where megatron keeps the two pre-norm weights. The local spec (CPU, tests) has separate
#: RMSNorm modules; transformer-engine specs fuse them into the following linear layer.
NORM_NAMINGS: Dict[str, Tuple[str, str]] = {
    "local": ("input_layernorm.weight", "pre_mlp_layernorm.weight"),
    "te": ("self_attention.linear_qkv.layer_norm_weight", "mlp.linear_fc1.layer_norm_weight"),
}


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


def vocab_to_hf(weight: torch.Tensor, shape: BiGLMShape) -> torch.Tensor:
    """Megatron's padded vocabulary rows -> the tokenizer's `vocab_size` rows."""
    return weight[:shape.vocab_size].clone()


def vocab_from_hf(weight: torch.Tensor, shape: BiGLMShape) -> torch.Tensor:
    """The tokenizer's rows -> megatron's `padded_vocab_size` rows, padding zero-filled."""
    extra = shape.padded_vocab_size - shape.vocab_size
    return torch.cat([weight, weight.new_zeros(extra, weight.shape[1])]) if extra else weight.clone()


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class MappingRow:
    """Tensors `megatron` (names) <-> tensors `hf` (names), with one transform per direction.

    `to_hf(megatron_tensors, shape)` returns the HF tensors in `hf` order; `from_hf` the
    inverse. `megatron_shapes(shape)` / `hf_shapes(shape)` give the expected shapes in name
    order. `output_projection`: the row is the untied output projection, absent when the
    shape ties embeddings (a copy of it that a checkpoint still carries must then equal the
    embedding, and is skipped).
    """

    megatron: Tuple[str, ...]
    hf: Tuple[str, ...]
    to_hf: Callable[[Sequence[torch.Tensor], BiGLMShape], Tensors]
    from_hf: Callable[[Sequence[torch.Tensor], BiGLMShape], Tensors]
    megatron_shapes: Callable[[BiGLMShape], Shapes]
    hf_shapes: Callable[[BiGLMShape], Shapes]
    output_projection: bool = False

    @property
    def per_layer(self) -> bool:
        return any("{i}" in name for name in self.megatron + self.hf)


def _identity(tensors, shape):
    return tuple(tensors)


def _norm(s: BiGLMShape) -> Shapes:
    return ((s.hidden_size,),)


def _vocab_row(megatron: str, hf: str, output_projection: bool = False) -> MappingRow:
    """A [vocab, h] matrix: the word embedding, or the (untied) output projection."""
    return MappingRow(
        (megatron,), (hf,),
        lambda t, s: (vocab_to_hf(t[0], s),), lambda t, s: (vocab_from_hf(t[0], s),),
        lambda s: ((s.padded_vocab_size, s.hidden_size),),
        lambda s: ((s.vocab_size, s.hidden_size),),
        output_projection=output_projection)


#: The embedding both sides tie the output projection to.
MEGATRON_EMBEDDING = "embedding.word_embeddings.weight"
HF_EMBEDDING = "model.embed_tokens.weight"

WEIGHT_TABLE: Tuple[MappingRow, ...] = (
    _vocab_row(MEGATRON_EMBEDDING, HF_EMBEDDING),
    MappingRow(
        ("decoder.layers.{i}.{attn_norm}",), ("model.layers.{i}.input_layernorm.weight",),
        _identity, _identity, _norm, _norm),
    MappingRow(
        ("decoder.layers.{i}.self_attention.linear_qkv.weight",),
        ("model.layers.{i}.self_attn.q_proj.weight", "model.layers.{i}.self_attn.k_proj.weight",
         "model.layers.{i}.self_attn.v_proj.weight"),
        lambda t, s: qkv_to_hf(t[0], s), lambda t, s: (qkv_from_hf(*t, s),),
        lambda s: ((s.q_size + 2 * s.kv_size, s.hidden_size),),
        lambda s: ((s.q_size, s.hidden_size), (s.kv_size, s.hidden_size),
                   (s.kv_size, s.hidden_size))),
    MappingRow(
        ("decoder.layers.{i}.self_attention.linear_proj.weight",),
        ("model.layers.{i}.self_attn.o_proj.weight",),
        _identity, _identity,
        lambda s: ((s.hidden_size, s.q_size),), lambda s: ((s.hidden_size, s.q_size),)),
    MappingRow(
        ("decoder.layers.{i}.{mlp_norm}",), ("model.layers.{i}.post_attention_layernorm.weight",),
        _identity, _identity, _norm, _norm),
    MappingRow(
        ("decoder.layers.{i}.mlp.linear_fc1.weight",),
        ("model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.up_proj.weight"),
        lambda t, s: fc1_to_hf(t[0]), lambda t, s: (fc1_from_hf(*t),),
        lambda s: ((2 * s.ffn_hidden_size, s.hidden_size),),
        lambda s: ((s.ffn_hidden_size, s.hidden_size), (s.ffn_hidden_size, s.hidden_size))),
    MappingRow(
        ("decoder.layers.{i}.mlp.linear_fc2.weight",), ("model.layers.{i}.mlp.down_proj.weight",),
        _identity, _identity,
        lambda s: ((s.hidden_size, s.ffn_hidden_size),),
        lambda s: ((s.hidden_size, s.ffn_hidden_size),)),
    MappingRow(
        ("decoder.final_layernorm.weight",), ("model.norm.weight",),
        _identity, _identity, _norm, _norm),
    _vocab_row("output_layer.weight", "lm_head.weight", output_projection=True),
)


def _same(megatron: str, hf: str, size: Callable[[BiGLMShape], Tuple[int, ...]]) -> MappingRow:
    """A head tensor stored alike on both sides (no layout change)."""
    return MappingRow((megatron,), (hf,), _identity, _identity, lambda s: (size(s),), lambda s: (size(s),))


def head_rows(head: str, options: dict) -> Tuple[MappingRow, ...]:
    """The rows of a task head's weights, appended to `WEIGHT_TABLE` when a head model is
    converted: one per tensor of the head's module (`task_head.NAME` here), named on the HF side
    by its entry's `hf_names` (`model/task_heads.py`), stored alike on both sides."""
    entry = task_head(head)
    probe = entry.tensor_shapes(8, options)  # names do not depend on the width

    def row(name: str) -> MappingRow:
        return _same(f"task_head.{name}", entry.hf_name(name),
                     lambda s: entry.tensor_shapes(s.hidden_size, options)[name])

    return tuple(row(name) for name in probe)


#: Heads that HF `EuroBertForMaskedLM` cannot hold natively. Their tensors keep their megatron
#: names and go to a separate safetensors file in the export directory, which our inference
#: loading reads (`inference.loading.load_length_head`); plain transformers ignores the file.
#: name prefix -> file name.
SIDECAR_HEADS: Dict[str, str] = {"length_head.": "length_head.safetensors"}


def sidecar_file(name: str) -> str | None:
    """The sidecar file a megatron tensor `name` is exported to, or None (main weights)."""
    return next((f for prefix, f in SIDECAR_HEADS.items() if name.startswith(prefix)), None)


@dataclass(frozen=True)
class MappedGroup:
    """One row instantiated for a shape (and a layer): concrete names and shapes."""

    row: MappingRow
    megatron: Tuple[str, ...]
    hf: Tuple[str, ...]
    megatron_shapes: Shapes
    hf_shapes: Shapes


def expand_table(shape: BiGLMShape, norm_naming: str = "local",
                 table: Sequence[MappingRow] | None = None) -> Tuple[MappedGroup, ...]:
    """The table's rows for `shape`, in conversion order: a run of per-layer rows repeats for
    layers 0..L-1; the output projection is left out when embeddings are tied.
    `table`: None reads `WEIGHT_TABLE` at call time."""
    table = WEIGHT_TABLE if table is None else table
    attn_norm, mlp_norm = NORM_NAMINGS[norm_naming]
    out = []

    def emit(row: MappingRow, i: int | None) -> None:
        fill = dict(i=i, attn_norm=attn_norm, mlp_norm=mlp_norm)
        out.append(MappedGroup(row, tuple(n.format(**fill) for n in row.megatron),
                               tuple(n.format(**fill) for n in row.hf),
                               tuple(row.megatron_shapes(shape)), tuple(row.hf_shapes(shape))))

    rows = [r for r in table if not (r.output_projection and shape.tie_word_embeddings)]
    k = 0
    while k < len(rows):
        if not rows[k].per_layer:
            emit(rows[k], None)
            k += 1
            continue
        run = []
        while k < len(rows) and rows[k].per_layer:
            run.append(rows[k])
            k += 1
        for i in range(shape.num_layers):
            for row in run:
                emit(row, i)
    return tuple(out)
