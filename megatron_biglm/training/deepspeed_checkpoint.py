"""DeepSpeed-backend checkpoints: DeepSpeed's own save/load inside our atomic checkpoint scheme.

Layout of `iter_N/` (sealed by checkpoint_dir: temp dir -> manifest -> rename -> `latest`):

    deepspeed/state/        engine.save_checkpoint: module states + one ZeRO shard per rank
    dist/                   the model alone as a megatron torch_dist checkpoint
    rng/rank_*.pt, train_state.json, model_signature.json, config.yaml   as megatron checkpoints

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

import torch
import torch.distributed as dist

from megatron_biglm.training.checkpoint import _barrier, _broadcast_path, _rank, rng_state, set_rng_state
from megatron_biglm.training.checkpoint_dir import CheckpointError, new_temp_dir, seal
from megatron_biglm.training.config import RunConfig, save_resolved

CHECKPOINT_SUBDIR, CHECKPOINT_TAG = "deepspeed", "state"


def save_checkpoint(root: Path, iteration: int, model_chunks, optimizer, scheduler,  # noqa: ARG001
                    train_state: dict, config: RunConfig, signature: dict) -> Path:
    """Write `root/iter_N` atomically (every rank writes its ZeRO shard); return its path."""
    engine = model_chunks[0]
    tmp = None
    if _rank() == 0:
        tmp = new_temp_dir(root, iteration)
        (tmp / "rng").mkdir()
        (tmp / "dist").mkdir()
    tmp = _broadcast_path(tmp)
    engine.save_checkpoint(str(tmp / CHECKPOINT_SUBDIR), tag=CHECKPOINT_TAG, save_latest=False)
    save_model_weights(engine, tmp / "dist")
    torch.save(rng_state(), tmp / "rng" / f"rank_{_rank():05d}.pt")
    if _rank() == 0:
        state = dict(train_state, iteration=iteration, scheduler=scheduler.state_dict(),
                     world_size=dist.get_world_size() if dist.is_initialized() else 1, tp=1, pp=1,
                     dp=engine.dp_world_size, zero_stage=engine.zero_optimization_stage())
        (tmp / "train_state.json").write_text(json.dumps(state, indent=1))
        (tmp / "model_signature.json").write_text(json.dumps(signature, indent=1))
        save_resolved(config, tmp / "config.yaml")
    _barrier()
    final = seal(tmp, iteration, keep_last=config.checkpoint.keep_last) if _rank() == 0 else None
    _barrier()
    return _broadcast_path(final)


def save_model_weights(engine, folder: Path) -> None:
    """The model alone as a megatron torch_dist checkpoint (collective; ZeRO-3 gathers the
    partitioned parameters for the duration of the save)."""
    from megatron.core import dist_checkpointing

    module = engine.module
    gathered = contextlib.nullcontext()
    if engine.zero_optimization_stage() == 3:
        import deepspeed
        gathered = deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)
    with gathered:
        dist_checkpointing.save({"model": module.sharded_state_dict()}, str(folder))


def load_checkpoint(path: Path, model_chunks, optimizer, scheduler) -> dict:  # noqa: ARG001
    """Load model, ZeRO optimizer shards, schedule position and RNG; return the train state."""
    engine = model_chunks[0]
    state = json.loads((path / "train_state.json").read_text())
    loaded, _ = engine.load_checkpoint(str(path / CHECKPOINT_SUBDIR), tag=CHECKPOINT_TAG,
                                       load_optimizer_states=True, load_lr_scheduler_states=False)
    if loaded is None:
        raise CheckpointError(f"DeepSpeed could not load {path / CHECKPOINT_SUBDIR}/{CHECKPOINT_TAG}; "
                              f"point checkpoint.load at another checkpoint")
    scheduler.num_steps = 0
    scheduler.step(int(state["scheduler"]["num_steps"]))  # schedule shape comes from this run's config
    rng_file = path / "rng" / f"rank_{_rank():05d}.pt"
    if rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=False))
    state["rng_restored"] = rng_file.is_file()
    return state
