"""`biglm-serve` as a child process: start it on 127.0.0.1 with a port the system chooses, read
the port off its ready line, and stop it with SIGTERM (its graceful drain). What drives a real
server from outside: the benchmark (`python -m benchmarks serve`) and the serving tests."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

READY = re.compile(r"biglm-serve ready: model (\S+) at (http://\S+)")
_REPO = Path(__file__).resolve().parents[2]


class ServerProcess:
    """A running server: `proc`, its base `url` (`url + "/v1"` for OpenAI clients), its `log`."""

    def __init__(self, proc: subprocess.Popen, url: str, log: list[str]):
        self.proc, self.url, self.log = proc, url, log

    @property
    def v1(self) -> str:
        return self.url + "/v1"


@contextlib.contextmanager
def serve_process(model, *args: str, name: str = "model", startup_s: float = 300.0,
                  threads: int = 1):
    """Run `python -m megatron_biglm.cli.serve --model MODEL --port 0 --served-model-name NAME
    ARGS...` (torch on `threads` threads), yield a `ServerProcess` once it is ready, SIGTERM it
    on exit (killed if it has not exited 60 s later)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO), env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "megatron_biglm.cli.serve", "--model", str(model), "--host", "127.0.0.1",
         "--port", "0", "--served-model-name", name, *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    log: list[str] = []
    found: list[str] = []

    def read():
        for line in proc.stdout:
            log.append(line)
            match = READY.search(line)
            if match and not found:
                found.append(match.group(2))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + startup_s
    while not found and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if not found:
        proc.kill()
        proc.wait()
        raise RuntimeError("biglm-serve did not become ready:\n" + "".join(log[-40:]))
    try:
        yield ServerProcess(proc, found[0], log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(timeout=5)
