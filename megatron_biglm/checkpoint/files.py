"""The part of a checkpoint every backend writes the same way, and the collective around it.

    tmp = begin_checkpoint(root, iteration, subdirs=("dist",))   # all ranks: one shared temp dir
    ... the backend writes its model/optimizer shards into tmp ...
    return seal_checkpoint(tmp, iteration, train_state, signature, files)   # all ranks

`seal_checkpoint` adds what resume needs beyond the shards (every rank's RNG file; rank 0's
train_state.json, model_signature.json, config.yaml and the recipe's own records, `RunFiles`),
then `seal_when_written` seals the directory (dirs.seal: manifest, rename, `latest`) on rank
0 only after every rank finished writing, so a crash at any point leaves the previous
checkpoint as `latest`, and every file is in the manifest the verifier checks. Writers of
other checkpoints (e.g. weights-only imports) use begin_checkpoint and seal_when_written alone.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from .dirs import TRAIN_STATE, new_temp_dir, seal
from .rng import rng_state, set_rng_state
from .signature import SIGNATURE_FILE

RNG_DIR = "rng"
#: The resolved run config, beside every checkpoint's shards.
CONFIG_FILE = "config.yaml"


@dataclass(frozen=True)
class RunFiles:
    """What a run seals into each of its checkpoints beside the backend's shards and state,
    as plain text (this package sits below the run config's): `config_yaml`, the resolved
    run config (config.yaml); `extra`, the recipe's own records by file name (a fine-tune's
    task_head.json); and `keep_last`, how many complete checkpoints to keep (None: all)."""
    config_yaml: str
    keep_last: int | None = None
    extra: dict = field(default_factory=dict)


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def broadcast_path(path: Path | None) -> Path | None:
    """Rank 0's `path` on every rank (rank 0 alone creates and renames directories)."""
    obj = [str(path) if path is not None else None]
    if dist.is_initialized():
        dist.broadcast_object_list(obj, src=0)
    return Path(obj[0]) if obj[0] is not None else None


def begin_checkpoint(root: Path, iteration: int, subdirs: tuple[str, ...] = ()) -> Path:
    """Collective: a fresh temp dir beside `root/iter_N` holding `subdirs`, made by rank 0
    before any rank gets its path (so every rank can write into them at once)."""
    tmp = None
    if rank() == 0:
        tmp = new_temp_dir(root, iteration)
        for name in subdirs:
            (tmp / name).mkdir()
    return broadcast_path(tmp)


def seal_when_written(tmp: Path, iteration: int, keep_last: int | None = None) -> Path:
    """Collective: once every rank has written into `tmp`, rank 0 seals it as `iter_N`
    (dirs.seal); returns that path on every rank."""
    barrier()  # every rank's files are on disk before the manifest lists them
    final = seal(tmp, iteration, keep_last=keep_last) if rank() == 0 else None
    barrier()
    return broadcast_path(final)


def seal_checkpoint(tmp: Path, iteration: int, train_state: dict, signature: dict, files: RunFiles) -> Path:
    """Collective: write the shared files into `tmp`, seal it as `iter_N`; its path on every rank.

    `train_state` is what the backend resumes from (rank 0's copy is written); `files` the
    run's texts (config.yaml, the recipe's records), sealed with the rest."""
    taken = sorted(set(files.extra) & {TRAIN_STATE, SIGNATURE_FILE, CONFIG_FILE, RNG_DIR})
    if taken:
        raise ValueError(f"a recipe's checkpoint files may not be named {taken}: the checkpoint writes those itself")
    path = rng_file(tmp)
    path.parent.mkdir(exist_ok=True)
    torch.save(rng_state(), path)
    if rank() == 0:
        (tmp / TRAIN_STATE).write_text(json.dumps(train_state, indent=1))
        (tmp / SIGNATURE_FILE).write_text(json.dumps(signature, indent=1))
        (tmp / CONFIG_FILE).write_text(files.config_yaml, encoding="utf-8")
        for name, text in files.extra.items():
            (tmp / name).write_text(text, encoding="utf-8")
    return seal_when_written(tmp, iteration, keep_last=files.keep_last)


def rng_file(folder: Path) -> Path:
    return Path(folder) / RNG_DIR / f"rank_{rank():05d}.pt"


def restore_rng(folder: Path, saved_world_size: int) -> bool:
    """Continue this rank's saved RNG streams; only at the saved world size, where rank r's
    file is rank r's streams (after a layout change the streams start from the seed).
    Returns whether they were restored."""
    path = rng_file(folder)
    if saved_world_size != world_size() or not path.is_file():
        return False
    set_rng_state(torch.load(path, weights_only=False))
    return True
