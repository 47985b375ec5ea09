"""Refuse a checkpoint whose model disagrees with the run, naming every difference.

Only what changes tensor shapes or their meaning is compared: layer count, widths, heads,
vocabulary, tied embeddings. Parallel layout, batch size, lr and data may change on
resume (that is what resharding and continued training are for).
"""
from __future__ import annotations

from megatron_biglm.training.checkpoint_dir import CheckpointError

SHAPE_KEYS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "kv_channels", "vocab_size", "padded_vocab_size", "untie_embeddings_and_output_weights",
    "share_embeddings_and_output_weights", "gated_linear_unit", "normalization",
    "position_embedding_type",
)


def model_signature(model_fields: dict) -> dict:
    """The shape-defining subset of a resolved model config (a plain dict)."""
    return {k: model_fields[k] for k in SHAPE_KEYS if k in model_fields}


def check_compatible(saved: dict, current: dict, where: str) -> None:
    """Raise CheckpointError listing `key: checkpoint=X, run=Y` for every mismatch."""
    diffs = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if a != b:
            diffs.append(f"model.{key}: checkpoint={a}, this run={b}")
    if diffs:
        raise CheckpointError(
            f"checkpoint {where} does not match this run's model: " + "; ".join(diffs)
            + ". Use the checkpoint's model settings, or set checkpoint.load=none to start fresh.")
