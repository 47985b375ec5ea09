"""The scheduler's `BlockDecoder` over an adapter with the `SlotPrefixes` capability: each
candidate's prefix lives in its own slot of the adapter's preallocated key/value pool from the
block it joins until it leaves.

Per block, for the candidates of one block step (from any number of requests):
- a candidate seen for the first time takes a free slot; its `[BOS] + prompt` is written there;
- `blocks="cached"` (block-causal): the slot already holds the prompt and every finished block,
  so nothing is re-encoded; after the block its final tokens are appended to the slot;
- `blocks="refresh"` (the generator's default): every earlier row must see the block just
  finished, so the slot is emptied and `prompt + finished blocks` written again, in place;
- the T Mask-Predict iterations run only the open slots against the slots
  (`mask_predict.decode_block`), as `MaskPredictGenerator` decodes them alone.

A candidate that stops (EOS, last block) gives its slot back at once; `release` gives back the
slots of a request that leaves early (finished, timed out, cancelled, failed). The pool is
created with the scheduler's `max_rows` slots, so the keys/values held are `max_rows x
max_length` positions per layer; it grows (and stays grown) only for a single request with
more candidate rows than that (it runs alone), or for a scoring batch (the adapter's prefix
states take slots of the same pool for as long as they live) that finds it full.
"""
from __future__ import annotations

from typing import Sequence

import torch

from megatron_biglm.generation.blocks import Candidate, absorb_block
from megatron_biglm.generation.config import GenerationConfig
from megatron_biglm.generation.mask_predict import decode_block
from megatron_biglm.inference.engine import pad
from megatron_biglm.inference.protocol import SlotPrefixes

BLOCK_MODES = ("refresh", "cached")


class _SlotRows:
    """The forward `decode_block` runs: row i's slots after the prefix in `slots[i]`."""

    def __init__(self, adapter: SlotPrefixes, slots: list[int]):
        self.adapter, self.slots = adapter, slots
        self.pad_id = int(adapter.special.pad_id)
        self.device = adapter.device

    def logits(self, rows: Sequence[int], ids: torch.Tensor, widths: Sequence[int],
               wanted: torch.Tensor | None = None) -> torch.Tensor:
        a, w = ids.shape
        if wanted is None:
            wanted = torch.arange(w, device=self.device)[None].expand(a, -1)
        lengths = torch.tensor(list(widths), dtype=torch.long, device=self.device)
        return self.adapter.logits_after_slots([self.slots[r] for r in rows], ids, lengths, wanted)


class SlotPoolBlockDecoder:
    """Decodes blocks with `adapter` (a `MaskedLMAdapter` with `SlotPrefixes`), one pool slot
    per live candidate; `rows` slots are preallocated."""

    block_modes = BLOCK_MODES

    def __init__(self, adapter, rows: int):
        if not isinstance(adapter, SlotPrefixes):
            raise ValueError(f"{type(adapter).__name__} keeps no prefixes in pool slots (SlotPrefixes); "
                             "serve it with ExactCacheBlockDecoder")
        self.adapter = adapter
        self.pool = adapter.slot_pool(rows)
        self.mask_id = int(adapter.special.mask_id)
        eos = adapter.special.eos_id
        self.eos_id = None if eos is None else int(eos)
        self.pad_id = int(adapter.special.pad_id)
        self._held: dict[int, tuple[Candidate, int]] = {}  # id(candidate) -> (candidate, its slot)

    @property
    def slots_held(self) -> int:
        return len(self._held)

    def decode_block(self, candidates: Sequence[Candidate], config: GenerationConfig,
                     block_size: int, slot_offset: int) -> None:
        candidates = list(candidates)
        if config.blocks not in BLOCK_MODES:
            raise ValueError(f"blocks={config.blocks!r} is not served; use one of {BLOCK_MODES}")
        widths = [c.block_width(block_size) for c in candidates]
        fresh = [c for c in candidates if id(c) not in self._held]
        for c, slot in zip(fresh, self.pool.allocate(len(fresh))):
            self._held[id(c)] = (c, slot)
        slots = [self._held[id(c)][1] for c in candidates]
        with torch.no_grad():
            if config.blocks == "refresh":
                self.pool.reset(slots)
                self._write(slots, [c.prefix + c.tokens for c in candidates])
            elif fresh:
                self._write([self._held[id(c)][1] for c in fresh], [c.prefix + c.tokens for c in fresh])
            result = decode_block(_SlotRows(self.adapter, slots), list(range(len(candidates))), widths,
                                  slot_offset, config, self.mask_id, self.eos_id,
                                  [c.generator for c in candidates])
            block = slot_offset // block_size
            absorb_block(candidates, widths, result, block, self.mask_id,
                         self.eos_id if config.eos_cut else None)
            going = [i for i, c in enumerate(candidates) if c.block_width(block_size) > 0]
            if config.blocks == "cached" and going:
                self._write([slots[i] for i in going], [candidates[i].tokens[-widths[i]:] for i in going])
        self.release([c for c in candidates if c.block_width(block_size) == 0])

    def release(self, candidates: Sequence[Candidate]) -> None:
        """Give back the slots of `candidates` (those holding none are skipped)."""
        slots = [self._held.pop(id(c))[1] for c in candidates if id(c) in self._held]
        if slots:
            self.pool.release(slots)

    def _write(self, slots: list[int], rows: list[list[int]]) -> None:
        room = int(self.adapter.max_length) - max(self.pool.length(s) for s in slots)
        ids, lengths = pad(rows, self.pad_id, self.adapter.device, adapter=self.adapter, room=room)
        self.adapter.write_slots(slots, ids, lengths)
