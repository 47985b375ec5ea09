"""One run per run directory (run/run_lock.py): a second start while a run holds its run_dir
fails at once, naming the holder, and touches nothing of it; a lock left by a process that is
gone is taken over with a note, and a requeued SLURM job resumes. The holders here are real
processes."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from finetune_entry_fixtures import finetune_overrides, write_task

REPO = Path(__file__).resolve().parents[2]
#: another run's process as it holds its run_dir (the lock, the holder record), without the
#: seconds of importing the package
HOLD = """
import datetime, fcntl, json, os, socket, sys, time
os.makedirs(sys.argv[1], exist_ok=True)
fd = os.open(os.path.join(sys.argv[1], "run.lock"), os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.write(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
                         "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}).encode())
print("held", flush=True)
time.sleep(600)
"""


def _holder(run_dir, **env):
    """A process that holds `run_dir`'s lock until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), **env})
    assert proc.stdout.readline().strip() == "held"
    return proc


def _tree(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_second_pretraining_fails_at_once_naming_the_holder(tmp_path, capsys):
    from megatron_biglm.cli.train import main

    run_dir = tmp_path / "run"
    proc = _holder(run_dir)
    try:
        before = _tree(run_dir)
        config = tmp_path / "run.yaml"
        config.write_text("schedule:\n  train_steps: 4\n  warmup_steps: 1\n")
        started = time.monotonic()
        assert main(["--config", str(config), f"run_dir={run_dir}"]) == 2
        assert time.monotonic() - started < 30
        assert re.search(rf"\Aerror: run_dir {run_dir} is in use by another run \(pid {proc.pid} on .*\n\Z",
                         capsys.readouterr().err)
        assert _tree(run_dir) == before
    finally:
        proc.kill()
        proc.wait()


def test_a_second_finetune_fails_naming_host_pid_and_start(tmp_path, capsys):
    from megatron_biglm.config import load_config
    from megatron_biglm.run import finetune
    from megatron_biglm.run.run_lock import RunDirBusy

    task = write_task(tmp_path / "task", n_train=8, n_valid=4, n_test=4)
    run_dir = tmp_path / "run"
    proc = _holder(run_dir)
    try:
        before = _tree(run_dir)
        with pytest.raises(RunDirBusy, match=rf"run_dir {run_dir} is in use by another run \(pid {proc.pid} on "
                                             rf"{socket.gethostname()}, started 20\d\d-.*\); wait for it"):
            finetune(load_config(None, finetune_overrides(task, run_dir)))
        assert _tree(run_dir) == before
    finally:
        proc.kill()
        proc.wait()


def test_a_lock_left_by_a_process_that_is_gone_is_taken_over_with_a_note(tmp_path):
    from megatron_biglm.run.run_lock import acquire, release

    run_dir = tmp_path / "run"
    proc = _holder(run_dir)
    proc.send_signal(signal.SIGKILL)  # killed: its lock file stays, the kernel's lock goes
    proc.wait()
    fd, note = acquire(run_dir)
    try:
        assert note.startswith(f"run_dir {run_dir}: took over the lock left by pid {proc.pid} on ")
        assert note.endswith("a process that is gone")
    finally:
        release(run_dir, fd)
    assert not (run_dir / "run.lock").exists()  # released: the next run finds no lock


def test_a_requeued_slurm_job_takes_over_its_own_lock(tmp_path, monkeypatch):
    from megatron_biglm.run.run_lock import LOCK_FILE, acquire, release

    run_dir = tmp_path / "run"
    proc = _holder(run_dir, SLURM_JOB_ID="4242")
    proc.send_signal(signal.SIGKILL)  # what a requeue does to the job's processes
    proc.wait()
    assert json.loads((run_dir / LOCK_FILE).read_text())["slurm_job_id"] == "4242"
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    fd, note = acquire(run_dir)
    try:
        assert note == f"run_dir {run_dir}: SLURM job 4242 requeued; resuming its run"
    finally:
        release(run_dir, fd)


@pytest.mark.slow
def test_two_finetunes_at_once_the_second_fails_and_the_first_finishes_untouched(tmp_path):
    from megatron_biglm.config import load_config
    from megatron_biglm.run import finetune
    from megatron_biglm.run.run_lock import LOCK_FILE, RunDirBusy

    task = write_task(tmp_path / "task", n_train=32, n_valid=8, n_test=8)
    run_dir = tmp_path / "run"
    overrides = finetune_overrides(task, run_dir, **{"finetune.epochs": 2})  # 4 steps
    config = tmp_path / "ft.yaml"
    config.write_text("{}\n")
    first = subprocess.Popen([sys.executable, "-m", "megatron_biglm.cli.finetune", "--config", str(config), *overrides],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / LOCK_FILE).is_file() or f'"pid": {first.pid}' not in (run_dir / LOCK_FILE).read_text():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
            time.sleep(0.2)
        started = time.monotonic()
        with pytest.raises(RunDirBusy, match=rf"in use by another run \(pid {first.pid} on {socket.gethostname()}"):
            finetune(load_config(None, overrides))
        assert time.monotonic() - started < 10
        assert first.wait(timeout=300) == 0, first.stderr.read()
    finally:
        first.kill()
        first.wait()
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if json.loads(line).get("kind") == "train"]
    assert steps == sorted(set(steps))  # one run's steps, once each
    assert json.loads((run_dir / "results.json").read_text())["finished"]
    assert not (run_dir / LOCK_FILE).exists()
