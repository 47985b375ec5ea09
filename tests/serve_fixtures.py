"""A real `biglm-serve` subprocess on 127.0.0.1 (port chosen by the system, read from the ready
line) for the serving tests, and small HTTP helpers."""
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

import requests

REPO = Path(__file__).resolve().parents[1]
READY = re.compile(r"biglm-serve ready: model (\S+) at (http://\S+)")
MODEL_NAME = "tiny"


class Server:
    def __init__(self, proc: subprocess.Popen, url: str, log: list[str]):
        self.proc, self.url, self.log = proc, url, log

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def post(self, path: str, **kwargs) -> requests.Response:
        return requests.post(self.url + path, timeout=kwargs.pop("timeout", 120), **kwargs)

    def metrics(self) -> dict[str, float]:
        from megatron_biglm.serving.metrics import parse_counters

        return parse_counters(requests.get(self.url + "/metrics", timeout=30).text)


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


@contextlib.contextmanager
def serve(model, *extra: str, startup_s: float = 300.0):
    """Start `python -m megatron_biglm.cli.serve --model MODEL --port 0 ...`, wait for its ready
    line, yield a `Server`; on exit SIGTERM it (if still running) and wait."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "megatron_biglm.cli.serve", "--model", str(model), "--host", "127.0.0.1",
         "--port", "0", "--served-model-name", MODEL_NAME, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=REPO)
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
        yield Server(proc, found[0], log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(timeout=5)
