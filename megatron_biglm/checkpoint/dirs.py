"""Atomic checkpoint directories: write to a temp dir, seal it, rename, then move `latest`.

Layout under `checkpoint.dir`:

    latest                  text: the name of the newest complete checkpoint
    best                    text (fine-tuning): the checkpoint with the best validation metric;
                            `keep_last` never deletes it
    iter_0000100/
        COMPLETE.json       manifest: iteration + every file's size, written last
        config.yaml         the resolved run config
        ...                 whatever the saver wrote (dist_checkpointing shards, rng, state)
    .tmp-iter_0000200-*/    an interrupted save: never loaded, removed by the next save

Why a manifest and not just a marker: a checkpoint copied or synced partially (or a disk
that filled up) keeps its marker but loses bytes; checking each file's size refuses it
with a message naming the file instead of failing deep inside torch.load.

A checkpoint whose train_state.json says `"weights_only": true` (an HF import written by
export.convert_from_hf) holds model weights only: a starting point, not a resume point.
`choose_start` lets a run's own checkpoints take precedence over such a starting point.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "COMPLETE.json"
LATEST = "latest"
#: the config key that names a checkpoint to load, unless the caller says which key named it
LOAD_KEY = "checkpoint.load"
BEST = "best"
TRAIN_STATE = "train_state.json"
#: `train_state.json` flag of a checkpoint that holds model weights only (no optimizer,
#: scheduler or RNG state).
WEIGHTS_ONLY_KEY = "weights_only"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message says why and what to do."""


def iteration_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def new_temp_dir(root: Path, iteration: int) -> Path:
    """A fresh temp dir beside the final one (same filesystem, so rename is atomic)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".tmp-{iteration_name(iteration)}-", dir=root))


def _manifest(folder: Path) -> dict:
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            files[str(path.relative_to(folder))] = path.stat().st_size
    return files


def seal(temp_dir: Path, iteration: int, keep_last: int | None = None) -> Path:
    """Write the manifest, rename temp → `iter_N`, point `latest` at it (single writer)."""
    temp_dir = Path(temp_dir)
    root = temp_dir.parent
    manifest = {"iteration": iteration, "files": _manifest(temp_dir)}
    with open(temp_dir / MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    final = root / iteration_name(iteration)
    if final.exists():  # a re-save of the same step (e.g. final save right after a periodic one)
        shutil.rmtree(final)
    os.replace(temp_dir, final)
    pointer_tmp = root / f".{LATEST}.tmp"
    pointer_tmp.write_text(final.name + "\n")
    os.replace(pointer_tmp, root / LATEST)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if keep_last:
        best = best_checkpoint_name(root)
        for old in complete_checkpoints(root)[:-keep_last]:
            if old.name != best:
                shutil.rmtree(old, ignore_errors=True)
    return final


def previous_checkpoint(folder: Path) -> Path | None:
    """The newest complete checkpoint older than `folder` beside it (where to go when `folder`
    is damaged), or None."""
    folder = Path(folder)
    older = [p for p in complete_checkpoints(folder.parent) if p.name < folder.name]
    return older[-1] if older else None


def _earlier(folder: Path, key: str = LOAD_KEY) -> str:
    """Where to go instead of a damaged `folder`, said with the config key that named it."""
    prev = previous_checkpoint(folder)
    if prev:
        return f"Point {key} at an earlier complete checkpoint: `{key}={prev}`"
    return (f"Point {key} at an earlier complete checkpoint (none exists beside it), or "
            + ("start fresh with checkpoint.load=none" if key == LOAD_KEY else "at another checkpoint"))


def best_checkpoint_name(root: Path) -> str | None:
    """The checkpoint name the `best` pointer holds (fine-tuning), or None."""
    pointer = Path(root) / BEST
    return pointer.read_text().strip() if pointer.is_file() else None


def point_best(root: Path, iteration: int) -> Path:
    """Point `best` at `iter_N` (atomic replace, single writer); the checkpoint must exist."""
    root = Path(root)
    target = root / iteration_name(iteration)
    if not (target / MANIFEST).is_file():
        raise CheckpointError(f"cannot mark {target} as best: it is not a complete checkpoint")
    tmp = root / f".{BEST}.tmp"
    tmp.write_text(target.name + "\n")
    os.replace(tmp, root / BEST)
    return target


def verify(folder: Path, key: str = LOAD_KEY) -> dict:
    """The manifest of a complete checkpoint, or CheckpointError naming what is wrong (and
    where to go instead, said with `key`, the config key that named the checkpoint)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint {folder} does not exist")
    mpath = folder / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(
            f"checkpoint {folder} is incomplete: it has no {MANIFEST} (the save was interrupted). "
            f"{_earlier(folder, key)}, or remove this directory.")
    try:
        manifest = json.loads(mpath.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"checkpoint {folder}: {MANIFEST} is unreadable ({exc})") from None
    for rel, size in manifest["files"].items():
        path = folder / rel
        if not path.is_file():
            raise CheckpointError(f"checkpoint {folder} is truncated: file {rel} is missing. {_earlier(folder, key)}.")
        actual = path.stat().st_size
        if actual != size:
            raise CheckpointError(f"checkpoint {folder} is truncated: file {rel} has {actual} bytes, "
                                  f"the manifest says {size}. {_earlier(folder, key)}.")
    return manifest


def complete_checkpoints(root: Path) -> list[Path]:
    """`iter_*` dirs that carry a manifest, oldest first (sizes are checked on load)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("iter_*") if (p / MANIFEST).is_file())


def latest_checkpoint(root: Path, key: str = LOAD_KEY) -> Path | None:
    """The checkpoint `latest` points to (verified), or None when there is none yet."""
    root = Path(root)
    pointer = root / LATEST
    if not pointer.is_file():
        if complete_checkpoints(root):
            raise CheckpointError(f"{root} has checkpoints but no '{LATEST}' pointer; "
                                  f"set {key} to one of them explicitly")
        return None
    target = root / pointer.read_text().strip()
    verify(target, key)
    return target


def resolve_load_path(root: Path, load: str, key: str = LOAD_KEY) -> Path | None:
    """`auto` → latest under root (or None), `none` → None, else that directory (verified;
    `key`: the config key that named it, for the advice)."""
    if load == "none":
        return None
    if load == "auto":
        return latest_checkpoint(root)
    path = Path(load)
    if (path / LATEST).is_file():
        return latest_checkpoint(path, key)
    verify(path, key)
    return path


def is_weights_only(train_state: dict) -> bool:
    return bool(train_state.get(WEIGHTS_ONLY_KEY, False))


def refuse_weights_only(path: Path, state: dict) -> None:
    """A resume needs optimizer, scheduler and RNG state, which a weights-only checkpoint lacks."""
    if is_weights_only(state):
        raise CheckpointError(
            f"checkpoint {path} holds model weights only (an HF import) and cannot be resumed: start from it "
            f"with checkpoint.load={path} (run/train.py loads its weights with a fresh optimizer and schedule)")


def read_train_state_file(folder: Path) -> dict:
    """`folder/train_state.json`, or CheckpointError saying the folder is not a training checkpoint."""
    path = Path(folder) / TRAIN_STATE
    if not path.is_file():
        raise CheckpointError(f"checkpoint {folder} has no {TRAIN_STATE}: it was not written by megatron_biglm "
                              f"(run/train.py or `python -m megatron_biglm.cli.convert from-hf`)")
    return json.loads(path.read_text())


@dataclass(frozen=True)
class StartPoint:
    """The checkpoint a run starts from (`path` None: fresh), whether it holds weights only
    (fresh optimizer and schedule, step 0), and `note`: why it is not `checkpoint.load` itself."""
    path: Path | None
    weights_only: bool = False
    note: str | None = None


def choose_start(root: Path, load: str) -> StartPoint:
    """`resolve_load_path(root, load)`, except that a weights-only `checkpoint.load` (an
    import to fine-tune from) yields to this run's own latest checkpoint under `root` once
    there is one: re-running the same command after a preemption resumes the fine-tune
    instead of restarting it from the import."""
    path = resolve_load_path(root, load)
    if path is None:
        return StartPoint(None)
    weights_only = is_weights_only(read_train_state_file(path))
    if weights_only and load != "auto":
        own = latest_checkpoint(root)
        if own is not None and own.resolve() != path.resolve():
            return StartPoint(own, is_weights_only(read_train_state_file(own)),
                              note=f"checkpoint.load={load} is a weights-only starting point and this run "
                                   f"already saved {own}: resuming from that")
    return StartPoint(path, weights_only)
