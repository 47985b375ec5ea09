"""Compile counts of the current process: graphs compiled, recompilations and graph breaks,
read from torch._dynamo's counters and its recompilation log, so each GPU section can say
whether its timed code ran compiled once or kept recompiling."""
from __future__ import annotations

import logging


class _CountRecompiles(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.count = 0

    def emit(self, record) -> None:
        self.count += 1


_handler: _CountRecompiles | None = None


def _recompile_handler() -> _CountRecompiles:
    """A handler on dynamo's `recompiles` log artifact (it logs one record per recompilation)."""
    global _handler
    if _handler is None:
        import torch._logging

        _handler = _CountRecompiles()
        torch._logging.set_logs(recompiles=True)
        logger = torch._logging.getArtifactLogger("torch._dynamo.guards", "recompiles")
        logger.addHandler(_handler)
        logger.propagate = False  # counted here, not printed on every recompilation
    return _handler


def snapshot() -> dict:
    """{"graphs", "recompiles", "graph_breaks"} since the process started."""
    from torch._dynamo.utils import counters

    return dict(graphs=int(counters["stats"].get("unique_graphs", 0)),
                recompiles=_recompile_handler().count,
                graph_breaks=int(sum(counters["graph_break"].values())))


def since(before: dict) -> dict:
    now = snapshot()
    return {k: now[k] - before.get(k, 0) for k in now}
