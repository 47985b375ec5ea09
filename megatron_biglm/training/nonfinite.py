"""Skip steps whose loss is NaN/inf, count them, and stop after K in a row.

A single bad batch (or a transient overflow) should cost one step, not the run; a model
that has diverged should stop with a message while the last good checkpoint is still the
`latest` one, instead of writing NaN weights over it.
"""
from __future__ import annotations

import math


class TooManyNonFinite(RuntimeError):
    """Training stopped: the loss was NaN/inf for K steps in a row."""


class NonFiniteGuard:
    def __init__(self, max_in_a_row: int):
        self.max_in_a_row = max_in_a_row
        self.in_a_row = 0
        self.total_skipped = 0

    def check(self, loss: float, step: int) -> bool:
        """True if the step may be applied; False if it must be skipped. Raises after K."""
        if math.isfinite(loss):
            self.in_a_row = 0
            return True
        self.in_a_row += 1
        self.total_skipped += 1
        if self.in_a_row >= self.max_in_a_row:
            raise TooManyNonFinite(
                f"loss was {loss} for {self.in_a_row} steps in a row (last at step {step}; "
                f"{self.total_skipped} skipped in total); stopping without saving so the last good "
                f"checkpoint stays 'latest'. Lower optimizer.lr or raise training.max_nonfinite_in_a_row.")
        return False

    def state_dict(self) -> dict:
        return {"in_a_row": self.in_a_row, "total_skipped": self.total_skipped}

    def load_state_dict(self, state: dict) -> None:
        self.in_a_row = int(state.get("in_a_row", 0))
        self.total_skipped = int(state.get("total_skipped", 0))
