"""One run per run directory: an advisory lock (`fcntl.flock` on `run_dir/run.lock`) taken
before the run claims anything and held for its life.

Without it a second start into a live run_dir resumed the live run's checkpoint and wrote
duplicate steps into its metrics. The process of rank 0 (`RANK`/`SLURM_PROCID` unset or 0)
holds the lock for the whole job; the other ranks start only with it. A second start fails at
once, naming the holder (host, pid, start time, SLURM job) and touching nothing of the first.

The lock file records its holder and is removed when the run ends (with the run_dir, if the
run created it and wrote nothing). The kernel drops the lock when its process ends, so a lock
file left by a process that is gone (killed, crashed) is taken over, with a note naming it; a SLURM requeue of
the same job (the same `SLURM_JOB_ID`) resumes as the same run. Nested holds in one process
(the fine-tune driver, then `train()`) share the one lock.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
from pathlib import Path

from megatron_biglm.common.disk import DiskError, describe_os_error
from megatron_biglm.config import ConfigError

#: the file in run_dir that holds the lock and names its holder
LOCK_FILE = "run.lock"

_held: dict[str, int] = {}  # resolved run_dir -> open lock fd, for nested holds in this process
_created: dict[str, bool] = {}  # resolved run_dir -> whether taking its lock created the folder


class RunDirBusy(ConfigError):
    """Another live process holds this run directory."""


def _rank() -> int:
    for var in ("RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _holder() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID")}


def _describe(holder: dict) -> str:
    job = f", SLURM job {holder['slurm_job_id']}" if holder.get("slurm_job_id") else ""
    return f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}{job}"


def _read(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        return json.loads(os.read(fd, 4096).decode() or "{}")
    except (ValueError, UnicodeDecodeError):
        return {}


def _pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


def acquire(run_dir) -> tuple[int | None, str | None]:
    """Take the lock of `run_dir` (creating the folder); returns (fd, note), fd None when this
    process already holds it or is not rank 0. Raises `RunDirBusy` naming the live holder."""
    if _rank() != 0:
        return None, None

    run_dir = Path(run_dir)
    key = str(run_dir.resolve())
    if key in _held:
        return None, None
    created = not run_dir.exists()
    while True:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DiskError(describe_os_error(exc, run_dir, "run_dir")) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise RunDirBusy(f"run_dir {run_dir} is in use by another run ({_describe(holder)}); wait for it to "
                             f"end or give this run another run_dir. Nothing of that run was touched") from None
        try:  # the holder before may have removed the file between our open and our lock: lock the one there now
            if os.stat(run_dir / LOCK_FILE).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    before, mine = _read(fd), _holder()
    note = None
    if before.get("pid") and before.get("pid") != mine["pid"]:
        if before.get("slurm_job_id") and before.get("slurm_job_id") == mine["slurm_job_id"]:
            note = f"run_dir {run_dir}: SLURM job {mine['slurm_job_id']} requeued; resuming its run"
        elif before.get("host") == mine["host"] and not _pid_alive(before.get("pid")):
            note = f"run_dir {run_dir}: took over the lock left by {_describe(before)}, a process that is gone"
        else:
            note = f"run_dir {run_dir}: took over the lock last held by {_describe(before)}"
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(mine) + "\n").encode(), 0)
    _held[key] = fd
    _created[key] = created
    return fd, note


def release(run_dir, fd: int | None) -> None:
    """Remove the lock file (while still holding it) and unlock; a run_dir this process
    created and left empty (a start refused before it wrote anything) is removed too."""
    if fd is None:
        return
    run_dir = Path(run_dir)
    key = str(run_dir.resolve())
    _held.pop(key, None)
    with contextlib.suppress(OSError):
        (run_dir / LOCK_FILE).unlink()
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    if _created.pop(key, False):
        with contextlib.suppress(OSError):
            run_dir.rmdir()  # only if empty


@contextlib.contextmanager
def run_dir_lock(run_dir, say=print):
    """Hold `run_dir`'s lock for the block (a no-op when this process already holds it)."""
    fd, note = acquire(run_dir)
    if note:
        say(note)
    try:
        yield
    finally:
        release(run_dir, fd)


__all__ = ["LOCK_FILE", "RunDirBusy", "acquire", "release", "run_dir_lock"]
