"""Refuse a checkpoint whose model disagrees with the run, naming every difference.

Only what changes tensor shapes or their meaning is compared: layer count, widths, heads,
vocabulary, tied embeddings. Parallel layout, batch size, lr and data may change on
resume (that is what resharding and continued training are for).

Signatures are normalised before comparing: `num_query_groups: null` means one group per
head (plain multi-head attention), so it equals an explicit value equal to the head count
(an HF import always writes the explicit value; a preset may leave it null).
"""
from __future__ import annotations

from megatron_biglm.training.checkpoint_dir import CheckpointError

SHAPE_KEYS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "kv_channels", "vocab_size", "padded_vocab_size", "untie_embeddings_and_output_weights",
    "share_embeddings_and_output_weights", "gated_linear_unit", "normalization",
    "position_embedding_type",
)


def normalise_signature(signature: dict) -> dict:
    """`signature` with defaults spelled out, so equal shapes compare equal however they
    were written (signatures saved before this normalisation still hold the null)."""
    out = dict(signature)
    if out.get("num_query_groups") is None and out.get("num_attention_heads") is not None:
        out["num_query_groups"] = out["num_attention_heads"]
    return out


def model_signature(model_fields: dict) -> dict:
    """The shape-defining subset of a resolved model config (a plain dict), normalised."""
    return normalise_signature({k: model_fields[k] for k in SHAPE_KEYS if k in model_fields})


def check_compatible(saved: dict, current: dict, where: str) -> None:
    """Raise CheckpointError listing `key: checkpoint=X, run=Y` for every mismatch."""
    saved, current = normalise_signature(saved), normalise_signature(current)
    diffs = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if a != b:
            diffs.append(f"model.{key}: checkpoint={a}, this run={b}")
    if diffs:
        raise CheckpointError(
            f"checkpoint {where} does not match this run's model: " + "; ".join(diffs)
            + ". Use the checkpoint's model settings, or set checkpoint.load=none to start fresh.")
