"""A checkpoint in the trainer's layout: find it, verify it, read what it says about itself.

The trainer writes ``iter_N/`` folders holding ``dist/`` (torch_dist shards), ``config.yaml``
(the resolved run config), ``train_state.json``, ``model_signature.json`` and a size manifest,
plus a ``latest`` pointer beside them. `read_checkpoint` uses the trainer's own functions to
pick the latest *complete* checkpoint, so a truncated or half-copied checkpoint is refused
before any tensor is read.

What it returns is plain data (paths, the train state, the saved model signature): the run
config and model config are rebuilt from ``config.yaml`` one floor up, by
`megatron_biglm.config.trained_checkpoint.open_checkpoint`, which readers that need them use.

A checkpoint made by `from_hf` has the same layout with ``"weights_only": true`` in
``train_state.json``: model weights only, no optimizer/scheduler/RNG state (a starting point
for training or fine-tuning, not a resume point).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .dirs import (
    LATEST,
    LOAD_KEY,
    MANIFEST,
    TRAIN_STATE,
    WEIGHTS_ONLY_KEY,
    CheckpointError,
    is_weights_only,
    resolve_load_path,
)
from .files import CONFIG_FILE
from .signature import SIGNATURE_FILE

__all__ = ["WEIGHTS_ONLY_KEY", "SavedCheckpoint", "locate", "read_checkpoint"]


@dataclass
class SavedCheckpoint:
    """One complete checkpoint folder: its train state and saved model signature."""

    path: Path
    train_state: dict
    signature: dict

    @property
    def dist_dir(self) -> Path:
        return self.path / "dist"

    @property
    def config_path(self) -> Path:
        """The resolved run config the checkpoint was saved with."""
        return self.path / CONFIG_FILE

    @property
    def weights_only(self) -> bool:
        return is_weights_only(self.train_state)

    @property
    def consumed_samples(self) -> int:
        return int(self.train_state.get("consumed_samples", 0))


def locate(path, key: str | None = None) -> Path:
    """The checkpoint folder meant by `path`: an ``iter_N`` folder, a checkpoint root with
    ``latest``, a run directory with ``checkpoints/latest``, or a pointer file beside the
    ``iter_N`` folders (``latest``, or a fine-tune's ``best``). Verified complete. `key`: the config key that named
    it (e.g. `finetune.init_from`), named in every refusal with where to go instead."""
    path = Path(path).expanduser()
    named = f"{key}: " if key else ""
    if not path.exists():
        raise CheckpointError(f"{named}checkpoint {path} does not exist"
                              + (f"; set {key} to a checkpoint folder, checkpoint root or run directory"
                                 if key else ""))
    if path.is_file():  # a pointer: one line naming an iter_N folder beside it
        target = path.parent / path.read_text().strip()
        if not target.is_dir():
            raise CheckpointError(f"{path} points at {target.name}, which is not a folder beside it")
        path = target
    if not (path / LATEST).is_file() and (path / "checkpoints" / LATEST).is_file():
        path = path / "checkpoints"
    if not (path / LATEST).is_file() and not (path / MANIFEST).is_file():
        raise CheckpointError(
            f"{named}{path} is not a megatron-biglm checkpoint: expected an iter_N folder with {MANIFEST}, "
            "or a checkpoint directory with a `latest` pointer (as written by megatron_biglm.cli.train or "
            "`python -m megatron_biglm.cli.convert from-hf`)")
    folder = resolve_load_path(path, str(path), key or LOAD_KEY)
    if folder is None:  # pragma: no cover - resolve_load_path returns None only for load=none/auto
        raise CheckpointError(f"no complete checkpoint under {path}")
    return folder


def read_checkpoint(path, key: str | None = None) -> SavedCheckpoint:
    """Locate and verify (manifest sizes) a checkpoint; read its train state and signature
    (`key`: the config key that named it, as `locate`)."""
    folder = locate(path, key)
    for name in (CONFIG_FILE, TRAIN_STATE, SIGNATURE_FILE):
        if not (folder / name).is_file():
            raise CheckpointError(f"checkpoint {folder} has no {name}; it was not written by megatron_biglm")
    return SavedCheckpoint(folder, json.loads((folder / TRAIN_STATE).read_text()),
                           json.loads((folder / SIGNATURE_FILE).read_text()))
