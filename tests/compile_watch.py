"""Counting what torch.compile does while real code runs: the compile counts at chosen
points, and the difference after a warm-up (shared by the `recompile` tests of each package)."""
from __future__ import annotations

from megatron_biglm.common.compile_counts import CompileCounts, compile_counts


class CountsPerStep:
    """A training step callback recording the compile counts after each step."""

    def __init__(self):
        self.after: dict[int, CompileCounts] = {}

    def on_step(self, step, loop_state, ctx):  # noqa: ARG002 - the step callback's signature
        self.after[step] = compile_counts()


def describe(counts: CompileCounts) -> str:
    """The counts for an assertion message: totals and each break's first line."""
    reasons = "; ".join(f"{n}x {r.splitlines()[0] if r else ''}" for r, n in counts.graph_breaks)
    return f"{counts.compiles} compiles, {counts.recompiles} recompiles, {counts.breaks} breaks ({reasons})"
