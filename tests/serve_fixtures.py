"""A real `biglm-serve` subprocess (`serving.process.serve_process`) with the tests' model name,
and the HTTP helpers the serving tests share."""
from __future__ import annotations

import contextlib

import requests

from megatron_biglm.serving.metrics import parse_counters
from megatron_biglm.serving.process import serve_process

MODEL_NAME = "tiny"


class Server:
    def __init__(self, running):
        self.proc, self.url, self.v1, self.log = running.proc, running.url, running.v1, running.log

    def post(self, path: str, **kwargs) -> requests.Response:
        return requests.post(self.url + path, timeout=kwargs.pop("timeout", 120), **kwargs)

    def metrics(self) -> dict[str, float]:
        return parse_counters(requests.get(self.url + "/metrics", timeout=30).text)


@contextlib.contextmanager
def serve(model, *extra: str):
    with serve_process(model, *extra, name=MODEL_NAME) as running:
        yield Server(running)
