"""A trained checkpoint together with the run config and model config it was saved with.

Why here, one floor above checkpoint/: the folder, its verification and its files are
checkpoint/'s (plain data, no config types); rebuilding the configs from the saved
config.yaml needs the run config, which sits here. Export, evaluation and inference read a
checkpoint through `open_checkpoint`.

The one rule for a relative tokenizer path a checkpoint's config saved (`data.tokenizer: tok`,
as the pretraining config gave it, relative to where that run was launched): it is looked up
beside the run's saved config and in each folder above it (the checkpoint folder, its root,
the run directory, ... up to `/`), then in the working directory; the first directory found
wins. Not found, it stays as saved, and whoever needs it says which key to set. Runs save
an absolute tokenizer path (run/train.py), so this rule is for checkpoints saved before.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from megatron_biglm.checkpoint.dirs import CheckpointError
from megatron_biglm.checkpoint.dist_reader import DistCheckpointWeights
from megatron_biglm.checkpoint.run_checkpoint import SavedCheckpoint, read_checkpoint
from megatron_biglm.checkpoint.signature import check_compatible, signature_of
from megatron_biglm.checkpoint.task_head import EmbedderRecord, HeadRecord, read_task_head

from .loading import load_saved_config
from .run_config import RunConfig
from .task_head_migration import migrate_task_head

__all__ = ["TrainedCheckpoint", "open_checkpoint"]


@dataclass(kw_only=True)
class TrainedCheckpoint(SavedCheckpoint):
    """One complete checkpoint folder (path, train state, signature) and the configs it was
    saved with."""

    run_config: RunConfig
    model_config: object  # megatron_biglm.model.BiGLMModelConfig
    tokenizer_lookup: list = field(default_factory=list)  # where a relative saved tokenizer was looked for

    @property
    def training_tokens(self) -> int:
        """Tokens trained on: consumed samples × sequence length (the trainer also logs it)."""
        saved = self.train_state.get("consumed_tokens")
        return int(saved) if saved is not None else self.consumed_samples * self.run_config.data.seq_length

    def weights(self) -> DistCheckpointWeights:
        return DistCheckpointWeights(self.dist_dir, self.model_config.num_layers)

    def task_head(self) -> tuple[HeadRecord | EmbedderRecord | None, str | None]:
        """(the checkpoint's task-head record, a note): its `task_head.json`, or for a
        checkpoint saved without one the record `migrate_task_head` works out (with its note);
        None for a masked-LM model."""
        saved = read_task_head(self.path)
        return (saved, None) if saved is not None else migrate_task_head(self)


def open_checkpoint(path, key: str | None = None) -> TrainedCheckpoint:
    """Locate, verify (manifest sizes) and read a checkpoint's run config and train state.

    The model config is rebuilt from the saved run config and checked against the saved shape
    signature, so a preset file edited after training is caught here, not as a shape error.
    """
    saved = read_checkpoint(path, key)  # key: the config key that named it, for the refusals
    run_config = load_saved_config(saved.config_path)
    model_config = run_config.model.resolved
    try:
        check_compatible(saved.signature, signature_of(model_config), str(saved.path))
    except CheckpointError as exc:
        raise CheckpointError(
            f"{saved.path}/config.yaml no longer rebuilds the model that was saved (was the preset "
            f"{run_config.model['preset']!r} edited after training?): {exc}") from None
    looked = []
    if run_config.data.tokenizer:
        run_config.data.tokenizer, looked = resolve_saved_path(run_config.data.tokenizer, saved.path)
    return TrainedCheckpoint(saved.path, saved.train_state, saved.signature, run_config=run_config,
                             model_config=model_config, tokenizer_lookup=looked)


def resolve_saved_path(value: str, folder) -> tuple[str, list[str]]:
    """(the path, where it was looked for) of a relative path saved in the config of the
    checkpoint `folder`, by the module's rule; an absolute path, or a relative one found
    nowhere, is returned as saved (with the places looked)."""
    path = Path(value).expanduser()
    if path.is_absolute():
        return value, []
    folder = Path(folder).resolve()
    places = [folder, *folder.parents, Path(os.getcwd())]
    for place in places:
        if (place / path).is_dir():
            return str(place / path), []
    return value, [str(p) for p in places]
