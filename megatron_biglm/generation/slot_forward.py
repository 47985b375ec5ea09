"""Logits of the open block's slots given per-row prefixes, with or without the prefix cache.

The model input of a row is `prefix + slots`, with split = len(prefix): prefix rows see only the
prefix, slot rows see everything real. Since the prefix rows never see the slots, their keys and
values do not change while the slots are decoded, so with an adapter whose `prefix_cache` is
exact the prefix is encoded once (`encode_prefix`) and every iteration runs only the slot rows
(`logits_with_prefix`). Without it, every iteration is a full forward (`logits`) of the same
layout; both paths give the same logits up to rounding.

Prefixes change between blocks in two ways:
- `set_prefixes`: a new set of prefixes encoded from scratch (the first block, and every block
  of `blocks="refresh"`, where earlier rows must see the block just finished);
- `extend`: append each row's frozen block to its prefix (`blocks="cached"`, block-causal:
  the block's rows see the prefix and themselves, nothing after). With the cache the adapter's
  `extend_prefix` grows the cached keys/values; without it every iteration recomputes the same
  pattern from the ids (`BlockCausalLogits`, the reference the cache must match token for
  token), so a `block_causal` forward without a cache needs that capability.

The adapter follows `megatron_biglm.inference.MaskedLMAdapter`: `special`, `device`,
`prefix_cache`, `logits`, `encode_prefix`, `logits_with_prefix`, `extend_prefix`.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from megatron_biglm.inference.buckets import bucket_width
from megatron_biglm.inference.engine import pad
from megatron_biglm.inference.protocol import BlockCausalLogits
from megatron_biglm.model.kv_pool import on_device


class SlotForward:
    """Per-row prefixes (indexed 0..g-1 after each `set_prefixes` / `extend`) and the forward
    that scores slots after them."""

    def __init__(self, adapter, use_cache: bool, block_causal: bool = False):
        if use_cache and not adapter.prefix_cache:
            raise ValueError(f"{type(adapter).__name__} has no exact prefix cache (prefix_cache is "
                             "False); decode with use_cache=False")
        if block_causal and not use_cache and not isinstance(adapter, BlockCausalLogits):
            raise ValueError(f"{type(adapter).__name__} lacks the BlockCausalLogits capability "
                             "(block_causal_logits), which block-causal decoding without a cache "
                             "needs; use the prefix cache or blocks='refresh'")
        self.adapter = adapter
        self.use_cache = use_cache
        self.pad_id = int(adapter.special.pad_id)
        self.device = adapter.device
        self._prefixes: list[list[int]] = []
        self._starts: list[list[int]] = []  # per row: where each block appended by `extend` starts
        self._state: Any = None
        self.prefix_passes = 0  # prefix encodings run (rows x calls), for the cost report

    @property
    def prefix_lengths(self) -> list[int]:
        return [len(p) for p in self._prefixes]

    def set_prefixes(self, prefixes: Sequence[Sequence[int]]) -> None:
        self._prefixes = [list(p) for p in prefixes]
        self._starts = [[] for _ in self._prefixes]
        if self.use_cache:
            ids, lengths = pad(self._prefixes, self.pad_id, self.device, adapter=self.adapter)
            self._state = self.adapter.encode_prefix(ids, lengths)
            self.prefix_passes += 1

    def extend(self, rows: Sequence[int], blocks: Sequence[Sequence[int]]) -> None:
        """Row i of the new prefixes is old row `rows[i]` followed by `blocks[i]`, block-causal."""
        if self.use_cache:
            room = int(self.adapter.max_length) - max(len(self._prefixes[r]) for r in rows)
            ids, lengths = pad(blocks, self.pad_id, self.device, adapter=self.adapter, room=room)
            index = torch.tensor(list(rows), dtype=torch.long)  # on the host: a slot pool reads it there
            try:
                self._state = self.adapter.extend_prefix(self._state, index, ids, lengths)
            except NotImplementedError as exc:
                raise ValueError(f"{type(self.adapter).__name__} cannot extend a cached prefix ({exc}); "
                                 "use blocks='refresh'") from exc
            self.prefix_passes += 1
        elif not isinstance(self.adapter, BlockCausalLogits):
            raise ValueError(f"{type(self.adapter).__name__} lacks block_causal_logits; build the "
                             "forward with block_causal=True to be told before decoding starts")
        self._starts = [self._starts[r] + [len(self._prefixes[r])] for r in rows]
        self._prefixes = [self._prefixes[r] + list(b) for r, b in zip(rows, blocks)]

    def logits(self, rows: Sequence[int], slots: torch.Tensor, widths: Sequence[int],
               wanted: torch.Tensor | None = None) -> torch.Tensor:
        """Logits `[a, k, V]` after prefixes `rows` of the slots `[a, w]` (right-padded to
        `widths`): at the slot indices `wanted [a, k]` (default: every slot, k = w)."""
        a, w = slots.shape
        suffix_lengths = on_device(widths, self.device)
        prefix_lengths = [len(self._prefixes[r]) for r in rows]
        if wanted is None:
            wanted = torch.arange(w, device=self.device)[None].expand(a, -1)
        if self.use_cache:
            index = torch.tensor(list(rows), dtype=torch.long)  # on the host: a slot pool reads it there
            positions = wanted
            width = bucket_width(self.adapter, w, int(self.adapter.max_length) - max(prefix_lengths))
            if width > w:  # bucketed: padding columns, never attended to nor read
                slots = torch.cat([slots, slots.new_full((a, width - w), self.pad_id)], dim=1)
            return self.adapter.logits_with_prefix(self._state, index, slots, suffix_lengths, positions)
        ids, split, lengths, positions = full_rows(self.adapter, self.pad_id, [self._prefixes[r] for r in rows],
                                                   slots, widths, wanted=wanted)
        starts = [self._starts[r] + [p] for r, p in zip(rows, prefix_lengths)]
        if max(map(len, starts)) == 1:  # no extended blocks: the plain split
            return self.adapter.logits(ids, lengths, split, positions)
        m = max(map(len, starts))  # a repeated start changes nothing in the mask
        starts_t = torch.tensor([s + [s[-1]] * (m - len(s)) for s in starts], dtype=torch.long,
                                device=self.device)
        return self.adapter.block_causal_logits(ids, lengths, starts_t, positions)


def full_rows(adapter, pad_id: int, prefixes: Sequence[Sequence[int]], slots: torch.Tensor,
              widths: Sequence[int], later: Sequence[int] | None = None, wanted: torch.Tensor | None = None):
    """The uncached model input: row i is `prefixes[i]`, the slots `slots[i, :widths[i]]` and
    `later[i]` masks (none by default), right-padded to a bucketed width. Returns (ids, the
    prefix lengths [a], the real lengths [a], the positions [a, k] of the slot indices
    `wanted` (default: every slot))."""
    a, w = slots.shape
    device = slots.device
    later = later if later is not None else [0] * a
    prefix_lengths = [len(p) for p in prefixes]
    lengths = [p + n + k for p, n, k in zip(prefix_lengths, widths, later)]
    ids = torch.full((a, bucket_width(adapter, max(lengths))), pad_id, dtype=torch.long, device=device)
    for i, (p, n) in enumerate(zip(prefix_lengths, widths)):
        ids[i, :p] = torch.tensor(list(prefixes[i]), dtype=torch.long, device=device)
        ids[i, p:p + n] = slots[i, :n]
        ids[i, p + n:lengths[i]] = int(adapter.special.mask_id)
    start = torch.tensor(prefix_lengths, dtype=torch.long, device=device)
    if wanted is None:
        wanted = torch.arange(w, device=device)[None].expand(a, -1)
    positions = (start[:, None] + wanted).clamp(max=ids.shape[1] - 1)
    return ids, start, torch.tensor(lengths, dtype=torch.long, device=device), positions


# ------------------------------------------------------------------ whole canvas
# Logits of the open block's slots inside the whole canvas: LLaDA's semi-autoregressive decoding.
# 
# The model input of a row is `[BOS] + prompt + finished tokens + open block + one mask per later
# slot`, under full bidirectional attention (no split): every row sees every real token, the
# prompt included, so nothing can be cached and every iteration runs the whole canvas. It
# differs from block-causal decoding by design; `benchmarks longform` compares the two.
# Same interface as `SlotForward` (`device`, `pad_id`, `logits`, `prefix_passes`), so
# `mask_predict.decode_block` runs either.
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

    def logits(self, rows: Sequence[int], slots: torch.Tensor, widths: Sequence[int],
               wanted: torch.Tensor | None = None) -> torch.Tensor:
        """Logits `[a, k, V]` in canvases `rows` of the slots `[a, w]` (right-padded to
        `widths`): at the slot indices `wanted [a, k]` (default: every slot)."""
        ids, _, lengths, positions = full_rows(self.adapter, self.pad_id, [self._prefixes[r] for r in rows],
                                               slots, widths, [self._later[r] for r in rows], wanted)
        return self.adapter.logits(ids, lengths, None, positions)
