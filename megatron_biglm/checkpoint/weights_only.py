"""Load only the model weights of a megatron-biglm checkpoint into a built model chunk.

Who needs it: the trainer when it starts from a checkpoint marked ``"weights_only": true``
(written by `from_hf`: no optimizer, scheduler or RNG state to restore), fine-tuning, and
in-process evaluation of a trained checkpoint. Any checkpoint works, whatever TP/PP it was
saved at: `dist_checkpointing` reshards it to the model's current layout. Call it on every
rank of the job (it is collective).

The model's shape is checked against the signature saved with the checkpoint (the shape its
tensors have), so no run config or model config needs rebuilding here.

A task head (`task_head.*`, model/head_model.py) that the checkpoint has none of starts
fresh: a classification fine-tune from a pretrained (masked-LM) checkpoint keeps the model's
new head, and says so. Every other missing tensor, or a head stored only in part, is an error.
"""
from __future__ import annotations

from .dirs import CheckpointError
from .run_checkpoint import SavedCheckpoint, read_checkpoint
from .signature import normalise_signature, signature_of
from .verify import verify_checkpoint


def load_model_weights(checkpoint, model, *, verify: bool = True) -> SavedCheckpoint:
    """Copy the checkpoint's model weights into `model` (a `BiGLMModel` chunk, optionally
    wrapped by DDP); return the checkpoint read (path, train state, `weights_only`).
    `verify`: CRC-check the checkpoint first (verify.py; collective); False when the caller
    already did (train.py, inference/loading.py) or the user opted out."""
    from megatron.core import dist_checkpointing

    saved = read_checkpoint(checkpoint)
    if verify:
        verify_checkpoint(saved.path, collective=True)
    module = getattr(model, "module", model)
    mine = signature_of(module.model_config)
    theirs = normalise_signature(saved.signature)
    if mine != theirs:
        diffs = [f"{k}: checkpoint={theirs.get(k)}, model={mine.get(k)}" for k in sorted(set(mine) | set(theirs))
                 if theirs.get(k) != mine.get(k)]
        raise CheckpointError(f"checkpoint {saved.path} holds another model shape: {'; '.join(diffs)}")
    sharded = module.sharded_state_dict()
    fresh = _heads_not_stored(sharded, saved)
    for name in fresh:
        del sharded[name]
    if fresh:
        print(f"{saved.path} has no task head: {', '.join(fresh)} start from their initialisation", flush=True)
    loaded = dist_checkpointing.load({"model": sharded}, str(saved.dist_dir))
    result = module.load_state_dict(loaded["model"], strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("_extra_state") and k not in fresh]
    if missing or result.unexpected_keys:
        raise CheckpointError(f"checkpoint {saved.path} does not fill the model: missing {missing[:4]}, "
                              f"unexpected {list(result.unexpected_keys)[:4]}")
    return saved


def _heads_not_stored(sharded: dict, saved: SavedCheckpoint) -> list[str]:
    """The model's `task_head.*` entries when the checkpoint stores none of them (else [])."""
    from torch.distributed.checkpoint import FileSystemReader

    head = [name for name in sharded if name.startswith("task_head.")]
    if not head:
        return []
    stored = set(FileSystemReader(str(saved.dist_dir)).read_metadata().state_dict_metadata)
    return head if not any(getattr(sharded[name], "key", name) in stored for name in head) else []
