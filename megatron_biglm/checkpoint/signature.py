"""Refuse a checkpoint whose model disagrees with the run, naming every difference.

Only what changes tensor shapes or their meaning is compared: layer count, widths, heads,
vocabulary, tied embeddings. Parallel layout, batch size, lr and data may change on
resume (that is what resharding and continued training are for).

Signatures are normalised before comparing: `num_query_groups: null` means one group per
head (plain multi-head attention), so it equals an explicit value equal to the head count
(an HF import always writes the explicit value; a preset may leave it null).
"""
from __future__ import annotations

import json
from pathlib import Path

from .dirs import TRAIN_STATE, CheckpointError

#: The file beside every checkpoint's shards holding its model signature.
SIGNATURE_FILE = "model_signature.json"

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


def signature_of(model_config) -> dict:
    """The signature of a model config object (a `BiGLMModelConfig`, or anything with
    `to_dict()` and `padded_vocab_size`): what resume and weight loading compare."""
    return model_signature({**model_config.to_dict(), "padded_vocab_size": model_config.padded_vocab_size})


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


def read_train_state(path: Path, signature: dict) -> dict:
    """The saved loop state of checkpoint `path`, after refusing it if its model differs from
    `signature` (this run's model)."""
    path = Path(path)
    saved_sig = json.loads((path / SIGNATURE_FILE).read_text())
    check_compatible(saved_sig, signature, str(path))
    return json.loads((path / TRAIN_STATE).read_text())
