"""Load only the model weights of a megatron-biglm checkpoint into a built model chunk.

Who needs it: the trainer when it starts from a checkpoint marked ``"weights_only": true``
(written by `from_hf`: no optimizer, scheduler or RNG state to restore), fine-tuning, and
in-process evaluation of a trained checkpoint. Any checkpoint works, whatever TP/PP it was
saved at: `dist_checkpointing` reshards it to the model's current layout. Call it on every
rank of the job (it is collective).

The model's shape is checked against the signature saved with the checkpoint (the shape its
tensors have), so no run config or model config needs rebuilding here.

Heads a fine-tune adds (`FRESH_HEAD_PREFIXES`: the task head, the CMLM length head) may be
absent from the start checkpoint (a pretraining run has neither): a head the checkpoint stores
none of keeps its fresh initialisation, and its names are printed (only
where the caller allows it: a fine-tune's start point, not inference). A head stored only in part, or any other tensor the
checkpoint lacks, is an error. A head stored with another shape (a fine-tuned 2-label head, and
a task with 3 labels or a regression) is refused naming `REINIT_OPTION`; with it set, the
caller's `reinit_mismatched=True`, that head keeps its fresh initialisation too, with a note
(as transformers' `ignore_mismatched_sizes`).
"""
from __future__ import annotations

import torch
from megatron.core import dist_checkpointing

from .dirs import CheckpointError
from .dist_reader import stored_keys, stored_shapes
from .run_checkpoint import SavedCheckpoint, read_checkpoint
from .signature import normalise_signature, signature_of
from .verify import verify_checkpoint

#: the fine-tune option that starts a head of another shape fresh (named in the refusal)
REINIT_OPTION = "finetune.reinit_mismatched_heads"


def load_model_weights(checkpoint, model, *, verify: bool = True, fresh_heads: bool = False,
                       reinit_mismatched: bool = False) -> SavedCheckpoint:
    """Copy the checkpoint's model weights into `model` (a `BiGLMModel` chunk, optionally
    wrapped by DDP); return the checkpoint read (path, train state, `weights_only`).
    `verify`: CRC-check the checkpoint first (verify.py; collective); False when the caller
    already did (run/train.py, inference/loading.py) or the user opted out.
    `fresh_heads`: a head the checkpoint stores none of keeps its initialisation (a fine-tune's
    start point); False (inference) refuses it, as any missing tensor.
    `reinit_mismatched`: a head stored with another shape keeps its initialisation (with a note)
    instead of being refused (`REINIT_OPTION`)."""
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
    wanted = module.sharded_state_dict()
    fresh = absent_heads(wanted, stored_keys(saved.dist_dir))
    if fresh and not fresh_heads:
        raise CheckpointError(f"checkpoint {saved.path} lacks the model's {', '.join(fresh)}: its saved config "
                              f"has a head its weights do not; re-export or re-save the checkpoint")
    mismatched = mismatched_heads(wanted, stored_shapes(saved.dist_dir))
    if mismatched and not reinit_mismatched:
        raise CheckpointError(f"checkpoint {saved.path} holds a head of another shape: {'; '.join(mismatched.values())} "
                              f"(another label count or task kind). Set {REINIT_OPTION}=true to start that head "
                              "fresh (the rest of the model loads), or start from a checkpoint without it")
    for name in [*fresh, *mismatched]:
        wanted.pop(name)
    loaded = dist_checkpointing.load({"model": wanted}, str(saved.dist_dir))
    result = module.load_state_dict(loaded["model"], strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("_extra_state") and k not in fresh and k not in mismatched]
    if missing or result.unexpected_keys:
        raise CheckpointError(f"checkpoint {saved.path} does not fill the model: missing {missing[:4]}, "
                              f"unexpected {list(result.unexpected_keys)[:4]}")
    if (fresh or mismatched) and (not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0):
        if fresh:
            print(f"weights from {saved.path}; not in it, so freshly initialised: {', '.join(fresh)}", flush=True)
        if mismatched:
            print(f"weights from {saved.path}; {REINIT_OPTION}: freshly initialised, as the stored shape differs: "
                  f"{'; '.join(mismatched.values())}", flush=True)
    return saved


#: Parameters a fine-tune adds on top of a pretrained model (model/heads.py, the length head).
FRESH_HEAD_PREFIXES = ("task_head.", "length_head.")


def absent_heads(sharded: dict, stored: set[str]) -> list[str]:
    """Names in `sharded` (a model's sharded state dict) of every head the checkpoint stores
    none of; a head stored in part raises CheckpointError (a damaged or foreign checkpoint)."""
    out = []
    for prefix in FRESH_HEAD_PREFIXES:
        names = [n for n in sharded if n.startswith(prefix) and not n.endswith("_extra_state")]
        absent = [n for n in names if getattr(sharded[n], "key", n) not in stored]
        if absent and len(absent) < len(names):
            raise CheckpointError(f"the checkpoint stores only part of the model's {prefix.rstrip('.')}: "
                                  f"{', '.join(absent)} missing; load a checkpoint with the whole head or without it")
        out += absent
    return out


def mismatched_heads(sharded: dict, shapes: dict) -> dict[str, str]:
    """{name: what differs} for every head tensor in `sharded` that the checkpoint stores with
    another global shape."""
    out = {}
    for name, item in sharded.items():
        key, shape = getattr(item, "key", name), getattr(item, "global_shape", None)
        if name.startswith(FRESH_HEAD_PREFIXES) and shape is not None and key in shapes \
                and tuple(shapes[key]) != tuple(shape):
            out[name] = f"{name} is {list(shapes[key])} there, {list(shape)} here"
    return out
