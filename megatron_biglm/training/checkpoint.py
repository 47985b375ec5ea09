"""Save and load a megatron-backend run with `dist_checkpointing`, atomically.

A checkpoint holds the model and optimizer (torch_dist shards, resharded on load, so DP and
TP/PP layouts may change), the scheduler step, RNG states, consumed samples, the NaN-skip
counters and the resolved config. The distributed optimizer is saved in megatron's
`dp_reshardable` format (the default `fully_sharded_model_space` fails on
flattened ranges, see patches/ and shared notes), which reloads at a different DP size.

All ranks write into one temp dir; rank 0 seals it (manifest, rename, `latest`) after a
barrier, so a crash at any point leaves the previous checkpoint as `latest`.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel

from megatron_biglm.training.checkpoint_compat import check_compatible, model_signature
from megatron_biglm.training.checkpoint_dir import CheckpointError, new_temp_dir, seal
from megatron_biglm.training.config import RunConfig, save_resolved

OPTIM_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier():
    if dist.is_initialized():
        dist.barrier()


def _broadcast_path(path: Path | None) -> Path | None:
    obj = [str(path) if path is not None else None]
    if dist.is_initialized():
        dist.broadcast_object_list(obj, src=0)
    return Path(obj[0]) if obj[0] is not None else None


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
             "tracker": tensor_parallel.get_cuda_rng_tracker().get_states()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _sharded(model_chunks, optimizer, is_loading: bool) -> dict:
    model_sd = model_chunks[0].module.sharded_state_dict()
    return {"model": model_sd,
            "optimizer": optimizer.sharded_state_dict(model_sd, is_loading=is_loading, metadata=OPTIM_METADATA)}


def save_checkpoint(root: Path, iteration: int, model_chunks, optimizer, scheduler, train_state: dict,
                    config: RunConfig, signature: dict) -> Path:
    """Write `root/iter_N` atomically; return its path (on every rank)."""
    tmp = None
    if _rank() == 0:
        tmp = new_temp_dir(root, iteration)
        (tmp / "dist").mkdir()
        (tmp / "rng").mkdir()
    tmp = _broadcast_path(tmp)
    dist_checkpointing.save(_sharded(model_chunks, optimizer, is_loading=False), str(tmp / "dist"))
    torch.save(rng_state(), tmp / "rng" / f"rank_{_rank():05d}.pt")
    if _rank() == 0:
        state = dict(train_state, iteration=iteration, scheduler=scheduler.state_dict(),
                     world_size=dist.get_world_size() if dist.is_initialized() else 1,
                     tp=parallel_state.get_tensor_model_parallel_world_size(),
                     pp=parallel_state.get_pipeline_model_parallel_world_size(),
                     dp=parallel_state.get_data_parallel_world_size())
        (tmp / "train_state.json").write_text(json.dumps(state, indent=1))
        (tmp / "model_signature.json").write_text(json.dumps(signature, indent=1))
        save_resolved(config, tmp / "config.yaml")
    _barrier()
    final = seal(tmp, iteration, keep_last=config.checkpoint.keep_last) if _rank() == 0 else None
    _barrier()
    return _broadcast_path(final)


def read_train_state(path: Path, signature: dict) -> dict:
    """The saved loop state, after refusing a checkpoint whose model differs from this run."""
    saved_sig = json.loads((path / "model_signature.json").read_text())
    check_compatible(saved_sig, signature, str(path))
    return json.loads((path / "train_state.json").read_text())


def load_checkpoint(path: Path, model_chunks, optimizer, scheduler) -> dict:
    """Load into the built model/optimizer/scheduler; return the saved train state."""
    state = json.loads((path / "train_state.json").read_text())
    _prime_optimizer_state(optimizer)
    loaded = dist_checkpointing.load(_sharded(model_chunks, optimizer, is_loading=True), str(path / "dist"))
    model_chunks[0].module.load_state_dict(loaded["model"], strict=False)
    with torch.no_grad():
        optimizer.load_state_dict(loaded["optimizer"])
    _restore_adam_steps(optimizer, state["iteration"] - state.get("nonfinite", {}).get("total_skipped", 0))
    scheduler.num_steps = 0
    scheduler.step(int(state["scheduler"]["num_steps"]))  # schedule shape comes from this run's config
    rng_file = path / "rng" / f"rank_{_rank():05d}.pt"
    same_layout = state["world_size"] == (dist.get_world_size() if dist.is_initialized() else 1)
    if same_layout and rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=False))
    state["rng_restored"] = bool(same_layout and rng_file.is_file())
    for chunk in model_chunks:
        if hasattr(chunk, "broadcast_params"):
            chunk.broadcast_params()
    return state


def _prime_optimizer_state(optimizer) -> None:
    """Hook for patches.distopt fixes (fresh optimizers have empty state)."""
    from megatron_biglm.training import distopt_fixes
    distopt_fixes.before_load(optimizer)


def _restore_adam_steps(optimizer, applied_steps: int) -> None:
    from megatron_biglm.training import distopt_fixes
    distopt_fixes.after_load(optimizer, applied_steps)


__all__ = ["save_checkpoint", "load_checkpoint", "read_train_state", "CheckpointError"]
