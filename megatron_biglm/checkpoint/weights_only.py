"""Load only the model weights of a megatron-biglm checkpoint into a built model chunk.

Who needs it: the trainer when it starts from a checkpoint marked ``"weights_only": true``
(written by `from_hf`: no optimizer, scheduler or RNG state to restore), fine-tuning, and
in-process evaluation of a trained checkpoint. Any checkpoint works, whatever TP/PP it was
saved at: `dist_checkpointing` reshards it to the model's current layout. Call it on every
rank of the job (it is collective).
"""
from __future__ import annotations

from megatron_biglm.training.checkpoint_dir import CheckpointError

from .run_checkpoint import TrainedCheckpoint, open_checkpoint, signature_of


def load_model_weights(checkpoint, model) -> TrainedCheckpoint:
    """Copy the checkpoint's model weights into `model` (a `BiGLMModel` chunk, optionally
    wrapped by DDP); return the opened checkpoint (configs, train state, `weights_only`)."""
    from megatron.core import dist_checkpointing

    opened = open_checkpoint(checkpoint)
    module = getattr(model, "module", model)
    mine = signature_of(module.model_config)
    saved = signature_of(opened.model_config)
    if mine != saved:
        diffs = [f"{k}: checkpoint={saved.get(k)}, model={mine.get(k)}" for k in sorted(set(mine) | set(saved))
                 if saved.get(k) != mine.get(k)]
        raise CheckpointError(f"checkpoint {opened.path} holds another model shape: {'; '.join(diffs)}")
    loaded = dist_checkpointing.load({"model": module.sharded_state_dict()}, str(opened.dist_dir))
    result = module.load_state_dict(loaded["model"], strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
    if missing or result.unexpected_keys:
        raise CheckpointError(f"checkpoint {opened.path} does not fill the model: missing {missing[:4]}, "
                              f"unexpected {list(result.unexpected_keys)[:4]}")
    return opened
