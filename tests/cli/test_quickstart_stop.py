"""The quickstart stops on SIGTERM or Ctrl-C in any stage: it exits 0, runs no later stage on a
stopped model, leaves no worker process behind, and a rerun of the same command resumes.

Runs the real `python -m megatron_biglm.cli.quickstart` in a subprocess on a small corpus and sends
the signal when its log shows the stage under test.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

pytestmark = pytest.mark.slow

ARGS = ["--max-plays", "8", "--steps", "40", "--eval-questions", "12", "--fill-mask-lines", "5", "--workers", "2"]


def _start(out):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "megatron_biglm.cli.quickstart", "--out", str(out), *ARGS],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _signal_at(proc, marker: str, sig, *, with_children: bool = False):
    """Read the log until `marker` (and, if asked, until the process has workers), send `sig`;
    returns (exit code, whole log, the pids of its children when the signal went out)."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if marker in line:
            break
    else:
        raise AssertionError("the quickstart ended before " + repr(marker) + ":\n" + "".join(lines[-30:]))
    parent = psutil.Process(proc.pid)
    deadline = time.time() + 60
    while with_children and not parent.children(recursive=True) and time.time() < deadline:
        time.sleep(0.05)
    children = [c.pid for c in parent.children(recursive=True)]
    sent = time.time()
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=300)
    return proc.returncode, "".join(lines) + rest, children, time.time() - sent


def _gone(pids, grace: float = 10.0) -> bool:
    """Every pid has ended within `grace` seconds of the parent's exit. multiprocessing's resource
    tracker ends by itself when it reads EOF from the parent it served, a moment after that parent."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    return all(p.status() == psutil.STATUS_ZOMBIE for p in alive if p.is_running())


def test_sigterm_in_pretraining_saves_stops_and_a_rerun_resumes(tmp_path):
    out = tmp_path / "qs"
    rc, log, children, took = _signal_at(_start(out), "[train] step 10", signal.SIGTERM)
    assert rc == 0, log[-3000:]
    assert "stopped by SIGTERM during pretrain" in log and took < 60
    assert not (out / "hf").exists() and not (out / "summary.json").exists()  # nothing ran later
    marker = json.loads((out / "pretrain" / "STOPPED.json").read_text())
    assert marker["signal"] == "SIGTERM" and 10 <= marker["step"] < 40
    assert _gone(children)

    rerun = subprocess.run([sys.executable, "-m", "megatron_biglm.cli.quickstart", "--out", str(out), *ARGS],
                           capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert f"resuming the run a SIGTERM stopped at step {marker['step']}" in rerun.stdout + rerun.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pretrain"]["steps"] == 40 and summary["pretrain"]["val_loss_start"] == marker["val_loss_start"]
    assert not (out / "pretrain" / "STOPPED.json").exists()


def test_ctrl_c_in_preprocessing_stops_its_workers_and_exits_zero(tmp_path):
    out = tmp_path / "qs"
    rc, log, children, took = _signal_at(_start(out), "tokenizer: vocab", signal.SIGINT, with_children=True)
    assert rc == 0, log[-3000:]
    assert "stopped by SIGINT during preprocess" in log and took < 60
    assert children and _gone(children)  # the tokenizer workers were shut down, not orphaned
    assert not (out / "pretrain").exists() and not (out / "summary.json").exists()
