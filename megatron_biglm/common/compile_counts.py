"""How often torch.compile compiled, recompiled and broke a graph in this process.

Benchmarks and tests read these to show that compiled code compiles once: a recompile inside a
timed window (a fresh shape, a guard on per-call Python state) or a graph break (eager pieces
between graphs) costs far more than the kernels it saves. Compiles and recompiles are counted
by a dynamo compile-start callback (`watch_compiles`, installed where layers are compiled; a
compile id `frame/n` with n > 0 is a recompile of that frame), graph breaks by dynamo's own
counter (`torch._dynamo.utils.counters["graph_break"]`, one count per break and compile). When
nothing was compiled, dynamo is not imported (it costs seconds) and every count is 0.
"""
from __future__ import annotations

import re
import sys
import threading
from dataclasses import dataclass

_LOCK = threading.Lock()
_COUNTS = {"compiles": 0, "recompiles": 0}


@dataclass(frozen=True)
class CompileCounts:
    """`compiles`: frames dynamo compiled (first compiles and recompiles; watched only after
    `watch_compiles`); `recompiles`: of those, compiled again after a guard failed;
    `graph_breaks`: (reason, count) pairs."""

    compiles: int = 0
    recompiles: int = 0
    graph_breaks: tuple[tuple[str, int], ...] = ()

    @property
    def breaks(self) -> int:
        return sum(n for _, n in self.graph_breaks)

    def since(self, before: "CompileCounts") -> "CompileCounts":
        """What happened after `before` was taken."""
        earlier = dict(before.graph_breaks)
        breaks = tuple((r, n - earlier.get(r, 0)) for r, n in self.graph_breaks if n > earlier.get(r, 0))
        return CompileCounts(self.compiles - before.compiles, self.recompiles - before.recompiles, breaks)

    def as_json(self) -> dict:
        """For a benchmark's JSON: the totals, and each break's reason (its first line) and count."""
        return {"compiles": self.compiles, "recompiles": self.recompiles, "graph_breaks": self.breaks,
                "break_reasons": {r.splitlines()[0] if r else "": n for r, n in self.graph_breaks}}


def watch_compiles() -> None:
    """Start counting dynamo's compiles and recompiles (idempotent; imports dynamo). Checked
    against dynamo's own list of callbacks: `torch._dynamo.reset()` empties it."""
    from torch._dynamo.callback import (  # lazy: start-up (dynamo only where layers compile)
        callback_handler,
        on_compile_start,
    )

    with _LOCK:
        if _on_compile_start in callback_handler.start_callbacks:
            return
        on_compile_start(_on_compile_start)


def _on_compile_start(args) -> None:
    if getattr(getattr(args, "callback_trigger", None), "name", "DYNAMO") != "DYNAMO":
        return  # a backward compiled lazily at its first run, or autotuning: no new frame
    match = re.search(r"(\d+)/(\d+)", str(getattr(args, "compile_id", "")))
    with _LOCK:
        _COUNTS["compiles"] += 1
        if match and int(match.group(2)) > 0:
            _COUNTS["recompiles"] += 1


def compile_counts() -> CompileCounts:
    """The counts so far in this process (all zero when dynamo was never imported)."""
    if "torch._dynamo" not in sys.modules:
        return CompileCounts()
    from torch._dynamo.utils import counters  # lazy: start-up (dynamo only where layers compile)

    breaks = tuple(sorted((str(r), int(n)) for r, n in counters["graph_break"].items()))
    with _LOCK:
        return CompileCounts(_COUNTS["compiles"], _COUNTS["recompiles"], breaks)
