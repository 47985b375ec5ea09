"""DeepSpeed-backend checkpoints: DeepSpeed's own save/load inside our atomic checkpoint scheme.

Layout of `iter_N/` (sealed by checkpoint/dirs.py: temp dir -> manifest -> rename -> `latest`):

    deepspeed/state/        engine.save_checkpoint: module states + one ZeRO shard per rank
    dist/                   the model alone as a megatron torch_dist checkpoint
    rng/rank_*.pt, train_state.json, model_signature.json, config.yaml (and a recipe's records)
                            as megatron checkpoints

The same train state (consumed samples, NaN counters, schedule step, backend, DP size),
RNG and signature files as megatron checkpoints, so resume, the model-compatibility refusal
and `latest` behave the same. ZeRO shards resume only at the same DP size
(`backends.check_resume` refuses other sizes before anything is built). `dist/` is one more
copy of the weights (no optimizer state) so that export to HF, evaluation and fine-tuning
read a DeepSpeed-trained checkpoint exactly like a megatron one.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

from megatron.core import dist_checkpointing

from megatron_biglm.checkpoint.dirs import CheckpointError, refuse_weights_only
from megatron_biglm.checkpoint.files import RunFiles, begin_checkpoint, restore_rng, seal_checkpoint, world_size
from megatron_biglm.common.mcore_internals import in_process_save_strategy
from megatron_biglm.training.schedule import resume_scheduler

CHECKPOINT_SUBDIR, CHECKPOINT_TAG = "deepspeed", "state"


def save_checkpoint(root: Path, iteration: int, model_chunks, optimizer, scheduler,  # noqa: ARG001
                    train_state: dict, files: RunFiles, signature: dict) -> Path:
    """Write `root/iter_N` atomically (every rank writes its ZeRO shard); return its path."""
    engine = model_chunks[0]
    tmp = begin_checkpoint(root, iteration, subdirs=("dist",))
    engine.save_checkpoint(str(tmp / CHECKPOINT_SUBDIR), tag=CHECKPOINT_TAG, save_latest=False)
    save_model_weights(engine, tmp / "dist")
    state = dict(train_state, iteration=iteration, scheduler=scheduler.state_dict(), world_size=world_size(),
                 tp=1, pp=1, dp=engine.dp_world_size, zero_stage=engine.zero_optimization_stage())
    return seal_checkpoint(tmp, iteration, state, signature, files)


def save_model_weights(engine, folder: Path) -> None:
    """The model alone as a megatron torch_dist checkpoint (collective; ZeRO-3 gathers the
    partitioned parameters for the duration of the save)."""

    module = engine.module
    gathered = contextlib.nullcontext()
    if engine.zero_optimization_stage() == 3:
        import deepspeed  # lazy: optional (deepspeed extra)
        gathered = deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)
    with gathered:
        dist_checkpointing.save({"model": module.sharded_state_dict()}, str(folder),
                                sharded_strategy=in_process_save_strategy())


def load_checkpoint(path: Path, model_chunks, optimizer, scheduler) -> dict:  # noqa: ARG001
    """Load model, ZeRO optimizer shards, schedule position and RNG; return the train state."""
    engine = model_chunks[0]
    state = json.loads((path / "train_state.json").read_text())
    refuse_weights_only(path, state)
    loaded, _ = engine.load_checkpoint(str(path / CHECKPOINT_SUBDIR), tag=CHECKPOINT_TAG,
                                       load_optimizer_states=True, load_lr_scheduler_states=False)
    if loaded is None:
        raise CheckpointError(f"DeepSpeed could not load {path / CHECKPOINT_SUBDIR}/{CHECKPOINT_TAG}; "
                              f"point checkpoint.load at another checkpoint")
    resume_scheduler(scheduler, state["scheduler"]["num_steps"])
    state["rng_restored"] = restore_rng(path, state["world_size"])  # same size: check_resume ensures it
    return state
