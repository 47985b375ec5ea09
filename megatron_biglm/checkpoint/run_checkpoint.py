"""A checkpoint in the trainer's layout: find it, verify it, read what it says about itself.

The trainer (`megatron_biglm.training.checkpoint`) writes ``iter_N/`` folders holding
``dist/`` (torch_dist shards), ``config.yaml`` (the resolved run config), ``train_state.json``,
``model_signature.json`` and a size manifest, plus a ``latest`` pointer beside them. The
converter reuses the trainer's own functions to pick the latest *complete* checkpoint, so a
truncated or half-copied checkpoint is refused before any tensor is read.

A checkpoint made by `from_hf` has the same layout with ``"weights_only": true`` in
``train_state.json``: model weights only, no optimizer/scheduler/RNG state (a starting point
for training or fine-tuning, not a resume point).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from megatron_biglm.training.checkpoint_compat import check_compatible, model_signature
from megatron_biglm.training.checkpoint_dir import WEIGHTS_ONLY_KEY, CheckpointError, is_weights_only, resolve_load_path
from megatron_biglm.training.config import RunConfig, load_config

from .dist_reader import DistCheckpointWeights

__all__ = ["WEIGHTS_ONLY_KEY", "TrainedCheckpoint", "locate", "open_checkpoint", "signature_of"]


def signature_of(model_config) -> dict:
    """The trainer's shape signature of a `BiGLMModelConfig` (what resume compares)."""
    return model_signature({**model_config.to_dict(), "padded_vocab_size": model_config.padded_vocab_size})


@dataclass
class TrainedCheckpoint:
    """One complete checkpoint folder and the configs it was saved with."""

    path: Path
    run_config: RunConfig
    model_config: object  # megatron_biglm.model.BiGLMModelConfig
    train_state: dict

    @property
    def dist_dir(self) -> Path:
        return self.path / "dist"

    @property
    def weights_only(self) -> bool:
        return is_weights_only(self.train_state)

    @property
    def consumed_samples(self) -> int:
        return int(self.train_state.get("consumed_samples", 0))

    @property
    def training_tokens(self) -> int:
        """Tokens trained on: consumed samples × sequence length (the trainer also logs it)."""
        saved = self.train_state.get("consumed_tokens")
        return int(saved) if saved is not None else self.consumed_samples * self.run_config.data.seq_length

    def weights(self) -> DistCheckpointWeights:
        return DistCheckpointWeights(self.dist_dir, self.model_config.num_layers)


def locate(path) -> Path:
    """The checkpoint folder meant by `path`: an ``iter_N`` folder, a checkpoint root with
    ``latest``, or a run directory with ``checkpoints/latest``. Verified complete."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if not (path / "latest").is_file() and (path / "checkpoints" / "latest").is_file():
        path = path / "checkpoints"
    if not (path / "latest").is_file() and not (path / "COMPLETE.json").is_file():
        raise CheckpointError(
            f"{path} is not a megatron-biglm checkpoint: expected an iter_N folder with COMPLETE.json, "
            "or a checkpoint directory with a `latest` pointer (as written by megatron_biglm.train or "
            "`convert_checkpoint.py from-hf`)")
    folder = resolve_load_path(path, str(path))
    if folder is None:  # pragma: no cover - resolve_load_path returns None only for load=none/auto
        raise CheckpointError(f"no complete checkpoint under {path}")
    return folder


def open_checkpoint(path) -> TrainedCheckpoint:
    """Locate, verify (manifest sizes) and read a checkpoint's run config and train state.

    The model config is rebuilt from the saved run config and checked against the saved shape
    signature, so a preset file edited after training is caught here, not as a shape error.
    """
    from megatron_biglm.model import load_preset

    folder = locate(path)
    for name in ("config.yaml", "train_state.json", "model_signature.json"):
        if not (folder / name).is_file():
            raise CheckpointError(f"checkpoint {folder} has no {name}; it was not written by megatron_biglm")
    run_config = load_config(folder / "config.yaml")
    overrides = {k: v for k, v in run_config.model.items() if k != "preset"}
    model_config = load_preset(run_config.model["preset"], overrides)
    saved_signature = json.loads((folder / "model_signature.json").read_text())
    try:
        check_compatible(saved_signature, signature_of(model_config), str(folder))
    except CheckpointError as exc:
        raise CheckpointError(
            f"{folder}/config.yaml no longer rebuilds the model that was saved (was the preset "
            f"{run_config.model['preset']!r} edited after training?): {exc}") from None
    train_state = json.loads((folder / "train_state.json").read_text())
    return TrainedCheckpoint(folder, run_config, model_config, train_state)
