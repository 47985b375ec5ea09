"""Room for a checkpoint: what one needs (the size of the last sealed one, else the model's
weights and Adam's states), refused before writing when the disk has less, and a save that
fails anyway reported as one line naming the folder and the cause.

A full disk under torch's writer reads "unexpected pos 704 vs 598"; a read-only folder is an
`OSError` deep in dist_checkpointing. Both are a `DiskError` here, and the half-written
temp folder is never sealed, so `latest` and `best` keep naming sealed checkpoints.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

from megatron_biglm.common.disk import DiskError, describe_os_error, free_bytes, no_space

from .dirs import complete_checkpoints

#: a save that fails with less than this free is taken to have filled the disk
_NEARLY_FULL = 16 << 20


def checkpoint_bytes(root, params=()) -> int:
    """Bytes the next checkpoint under `root` needs: the last sealed one's size, else the
    parameters' bytes plus Adam's two fp32 moments (and an fp32 master copy of lower precisions)."""
    done = complete_checkpoints(Path(root)) if Path(root).is_dir() else []
    if done:
        return sum(p.stat().st_size for p in done[-1].rglob("*") if p.is_file())
    total = 0
    for p in params:
        total += p.numel() * (p.element_size() + 8 + (4 if p.element_size() < 4 else 0))
    return total


def check_room(root, needed: int) -> None:
    """Refuse a save that cannot fit, before a byte of it is written."""
    if needed and free_bytes(root) < needed:
        raise no_space(root, needed, "checkpoint folder")


@contextlib.contextmanager
def save_errors(root, needed: int | None):
    """Around a save: an `OSError`, or any failure while the disk is (nearly) full, becomes a
    `DiskError` naming `root` and the cause."""
    try:
        yield
    except DiskError:
        raise
    except OSError as exc:
        raise DiskError(describe_os_error(exc, root, "checkpoint folder", needed)) from exc
    except Exception as exc:
        if free_bytes(root) < max(needed or 0, _NEARLY_FULL):
            raise no_space(root, needed, "checkpoint folder") from exc
        raise


__all__ = ["check_room", "checkpoint_bytes", "save_errors"]
