"""Skip steps whose loss is NaN/inf, count them, and stop after K in a row.

A single bad batch (or a transient overflow) should cost one step, not the run; a model
that has diverged should stop with a message while the last good checkpoint is still the
`latest` one, instead of writing NaN weights over it.

Two ways to decide, one set of counters:
  - `check(loss, step)`: on the host, for a backend that reads the loss every step anyway
    (DeepSpeed);
  - `observe(step, loss, ...)`: on the device, without a host sync. It returns the step's
    `found_inf` flag (a 0-d float tensor) for an optimizer that skips its update on the
    device (torch's fused Adam: parameters, moments and step count stay as they were), and
    keeps the counters in a device tensor. `settle()` reads them on the host (one read) and
    raises if K non-finite steps came in a row since the last settle; the loop settles at
    logging steps and before every save, so a diverged run never writes a checkpoint and
    the skipped steps in between changed no weights.
`state_dict` holds the same two numbers either way (`in_a_row`, `total_skipped`), read
from the device at save time, so a resumed run continues the counts bit for bit.
"""
from __future__ import annotations

import math

import torch

# the device counters: [in_a_row, total_skipped, longest run since settle, step of the last bad one]
_IN_A_ROW, _TOTAL, _PEAK, _LAST = range(4)


class TooManyNonFinite(RuntimeError):
    """Training stopped: the loss was NaN/inf for K steps in a row."""


class NonFiniteGuard:
    def __init__(self, max_in_a_row: int):
        self.max_in_a_row = max_in_a_row
        self._host = [0, 0, 0, 0]
        self._device: torch.Tensor | None = None

    @property
    def in_a_row(self) -> int:
        return self.settled()[_IN_A_ROW]

    @property
    def total_skipped(self) -> int:
        return self.settled()[_TOTAL]

    def check(self, loss: float, step: int) -> bool:
        """True if the step may be applied; False if it must be skipped. Raises after K."""
        counts = self.settled()
        if math.isfinite(loss):
            counts[_IN_A_ROW] = 0
            return True
        counts[_IN_A_ROW] += 1
        counts[_TOTAL] += 1
        counts[_PEAK] = max(counts[_PEAK], counts[_IN_A_ROW])
        counts[_LAST] = step
        self._raise_if_diverged(loss)
        return False

    def observe(self, step: int, *values: torch.Tensor) -> torch.Tensor:
        """Count this step on the device, bad when any of `values` (the loss, the gradient
        norm) is NaN/inf; returns its `found_inf` (1.0: skip the update)."""
        device = values[0].device
        if self._device is None or self._device.device != device:
            self._device = torch.tensor(self.settled(), dtype=torch.int64, device=device)
        finite = torch.stack([torch.isfinite(v.to(device)).all() for v in values]).all()
        bad = (~finite).to(torch.int64)
        c = self._device
        run = (c[_IN_A_ROW] + 1) * bad
        self._device = torch.stack([run, c[_TOTAL] + bad, torch.maximum(c[_PEAK], run),
                                    torch.where(bad.bool(), step, c[_LAST])])
        return bad.to(torch.float32)

    def settled(self) -> list[int]:
        """The counters on the host (a host read when the device holds newer ones)."""
        if self._device is not None:
            self._host = [int(v) for v in self._device.tolist()]
            self._device = None
        return self._host

    def settle(self, steps_run: int | None = None) -> None:
        """Read the device counters; raises TooManyNonFinite if K came in a row, or, given
        `steps_run` (the run's steps so far, at a save or its end), if every one of them was
        non-finite: such a run changed no weight, and must not be saved or reported as finished."""
        counts = self.settled()
        self._raise_if_diverged("NaN/inf")
        if steps_run and counts[_IN_A_ROW] >= steps_run:
            raise TooManyNonFinite(
                f"the loss was NaN/inf at every one of the run's {steps_run} steps (all skipped: no weight "
                f"changed); stopping without saving. Lower optimizer.lr, or check the data and the start "
                f"checkpoint.")

    def _raise_if_diverged(self, loss) -> None:
        counts = self._host
        if counts[_PEAK] >= self.max_in_a_row:
            raise TooManyNonFinite(
                f"loss was {loss} for {counts[_PEAK]} steps in a row (last at step {counts[_LAST]}; "
                f"{counts[_TOTAL]} skipped in total); stopping without saving so the last good "
                f"checkpoint stays 'latest'. Lower optimizer.lr or raise training.max_nonfinite_in_a_row.")

    def state_dict(self) -> dict:
        counts = self.settled()
        return {"in_a_row": counts[_IN_A_ROW], "total_skipped": counts[_TOTAL]}

    def load_state_dict(self, state: dict) -> None:
        self._device = None
        self._host = [int(state.get("in_a_row", 0)), int(state.get("total_skipped", 0)), 0, 0]
