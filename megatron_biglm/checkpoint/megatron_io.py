"""Save and load a megatron-backend run with `dist_checkpointing`, atomically.

A checkpoint holds the model and optimizer (torch_dist shards, resharded on load, so DP and
TP/PP layouts may change), the scheduler step, RNG states, consumed samples, the NaN-skip
counters, the resolved config and the recipe's own records (files.RunFiles; restoring the scheduler's position is the training
backend's part, training/backends.py: this package stays below training). The distributed
optimizer is saved in megatron's `dp_reshardable` format (patches.DISTOPT_METADATA: the
default `fully_sharded_model_space` fails on flattened ranges), which reloads at a different
DP size; the optimizer comes from training's build.build_optimizer with
patches.apply_distopt_checkpoint_fixes applied, which makes its load exact (state of a fresh
optimizer, AdamW steps).

All ranks write into one temp dir; rank 0 seals it after a barrier (files.py),
so a crash at any point leaves the previous checkpoint as `latest`. Each rank writes its shards
from its own process (common/mcore_internals.in_process_save_strategy: no writer processes per
save).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from megatron.core import dist_checkpointing, parallel_state

from megatron_biglm import patches
from megatron_biglm.common.mcore_internals import in_process_save_strategy

from .dirs import TRAIN_STATE, CheckpointError, refuse_weights_only
from .files import RunFiles, begin_checkpoint, restore_rng, seal_checkpoint, world_size


def _sharded(model_chunks, optimizer, is_loading: bool) -> dict:
    model_sd = model_chunks[0].module.sharded_state_dict()
    return {"model": model_sd,
            "optimizer": optimizer.sharded_state_dict(model_sd, is_loading=is_loading,
                                                      metadata=patches.DISTOPT_METADATA)}


def save_checkpoint(root: Path, iteration: int, model_chunks, optimizer, scheduler, train_state: dict,
                    files: RunFiles, signature: dict) -> Path:
    """Write `root/iter_N` atomically; return its path (on every rank). `files`: the run's
    texts sealed with it (files.RunFiles)."""
    tmp = begin_checkpoint(root, iteration, subdirs=("dist",))
    dist_checkpointing.save(_sharded(model_chunks, optimizer, is_loading=False), str(tmp / "dist"),
                            sharded_strategy=in_process_save_strategy())
    state = dict(train_state, iteration=iteration, scheduler=scheduler.state_dict(), world_size=world_size(),
                 tp=parallel_state.get_tensor_model_parallel_world_size(),
                 pp=parallel_state.get_pipeline_model_parallel_world_size(),
                 dp=parallel_state.get_data_parallel_world_size())
    return seal_checkpoint(tmp, iteration, state, signature, files)


def load_checkpoint(path: Path, model_chunks, optimizer) -> dict:
    """Load into the built model/optimizer and restore this rank's RNG streams; return the
    saved train state (its `scheduler` entry holds the schedule's step count)."""
    state = json.loads((path / TRAIN_STATE).read_text())
    refuse_weights_only(path, state)
    loaded = dist_checkpointing.load(_sharded(model_chunks, optimizer, is_loading=True), str(path / "dist"))
    model_chunks[0].module.load_state_dict(loaded["model"], strict=False)
    with torch.no_grad():  # as patches' load_no_grad does, for every optimizer (not only torch Adam)
        optimizer.load_state_dict(loaded["optimizer"])
    state["rng_restored"] = restore_rng(path, state["world_size"])
    for chunk in model_chunks:
        if hasattr(chunk, "broadcast_params"):
            chunk.broadcast_params()
    return state


__all__ = ["save_checkpoint", "load_checkpoint", "CheckpointError"]
