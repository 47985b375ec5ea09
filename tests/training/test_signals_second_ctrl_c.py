"""A second Ctrl-C while a graceful stop is pending ends the process with one line, exit 130,
and no traceback, even when it lands inside logging (whose lock a raised KeyboardInterrupt
would leave half-released). Run in a real subprocess that signals itself, so it is
deterministic: both signals arrive at known points, the second inside a logging call."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from second_ctrl_c import SCRIPT

ROOT = Path(__file__).resolve().parents[2]


def test_second_ctrl_c_ends_with_one_line_and_no_traceback():
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout == "first Ctrl-C recorded\n"
    assert done.returncode == 128 + signal.SIGINT, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == ["second Ctrl-C: stopped without saving; the last sealed checkpoint is kept"], done.stderr
