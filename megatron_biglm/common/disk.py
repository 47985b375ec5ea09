"""What a failed write says: one line naming the path and the cause (no space left with the
bytes needed and free, a read-only filesystem, no permission, a file where a folder belongs),
instead of the error of whatever library was writing (torch's zip writer says "unexpected pos
704 vs 598" on a full disk)."""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path


class DiskError(OSError):
    """A run's output cannot be written; the message names the path and the cause."""

    def __str__(self) -> str:
        return self.args[0] if self.args else ""


def human(n: float) -> str:
    """Bytes as people read them: 1.2 GB, 300 MB, 12 kB."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} bytes"


def _existing(path: Path) -> Path:
    """`path` or its nearest existing parent (what statvfs can ask about)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path) -> int:
    """Bytes free to this user on the filesystem that holds (or will hold) `path`."""
    return shutil.disk_usage(_existing(Path(path))).free


def no_space(path, needed: int | None, what: str) -> DiskError:
    need = f"{human(needed)} needed, " if needed else ""
    return DiskError(f"{what} {path}: no space left: {need}{human(free_bytes(path))} free; free space there or "
                     f"point it at another disk")


def describe_os_error(exc: OSError, path, what: str, needed: int | None = None) -> str:
    """The one line for an `OSError` met writing `what` at `path`."""
    path = Path(path)
    where = exc.filename or path
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return str(no_space(path, needed, what))
    if exc.errno == errno.EROFS:
        return f"{what} {path}: {where} is on a read-only filesystem; point {what} at a writable folder"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{what} {path}: no permission to write {where}; point {what} at a folder you can write"
    if exc.errno in (errno.EEXIST, errno.ENOTDIR) and _existing(path).is_file():
        return f"{what} {path}: {_existing(path)} is a file, not a folder; remove it or choose another {what}"
    return f"{what} {path}: {os.strerror(exc.errno) if exc.errno else exc}: {where}"


def check_writable_dir(path, what: str) -> None:
    """Refuse a folder that cannot hold a run's output (a file in its place, a read-only
    filesystem, no permission), naming it, before anything is written there."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise DiskError(describe_os_error(exc, path, what)) from None


__all__ = ["DiskError", "check_writable_dir", "describe_os_error", "free_bytes", "human", "no_space"]
