"""Logits of the open block's slots inside the whole canvas: LLaDA's semi-autoregressive decoding.

The model input of a row is `[BOS] + prompt + finished tokens + open block + one mask per later
slot`, under full bidirectional attention (no split): every row sees every real token, the
prompt included, so nothing can be cached and every iteration runs the whole canvas. It
differs from block-causal decoding by design; `benchmarks longform` compares the two.
Same interface as `SlotForward` (`device`, `pad_id`, `logits`, `prefix_passes`), so
`mask_predict.decode_block` runs either.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .slot_forward import full_rows


class CanvasForward:
    """Per-row canvases (prefix, then the open block's slots, then `later` masks)."""

    def __init__(self, adapter):
        self.adapter = adapter
        self.pad_id = int(adapter.special.pad_id)
        self.device = adapter.device
        self._prefixes: list[list[int]] = []
        self._later: list[int] = []
        self.prefix_passes = 0  # the prefix is never encoded on its own

    def set_canvases(self, prefixes: Sequence[Sequence[int]], later: Sequence[int]) -> None:
        """Row i: `prefixes[i]` (prompt and finished tokens), the open block, `later[i]` masks."""
        self._prefixes = [list(p) for p in prefixes]
        self._later = [int(n) for n in later]

    def logits(self, rows: Sequence[int], slots: torch.Tensor, widths: Sequence[int]) -> torch.Tensor:
        """Logits `[a, w, V]` of the slots `[a, w]` (right-padded to `widths`) in canvases `rows`."""
        ids, _, lengths, positions = full_rows(self.adapter, self.pad_id, [self._prefixes[r] for r in rows],
                                               slots, widths, [self._later[r] for r in rows])
        return self.adapter.logits(ids, lengths, None, positions)
