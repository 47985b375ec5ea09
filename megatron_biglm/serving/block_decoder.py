"""The scheduler's `BlockDecoder` over today's inference adapters and the exact prefix cache.

For one block of many candidates (from any number of requests): each candidate's prefix
`[BOS] + prompt + its finished blocks` is encoded once (`SlotForward.set_prefixes`, the
adapter's exact prefix K/V cache when it has one), and the T Mask-Predict iterations of the
block run only the open slots against it (`mask_predict.decode_block`). This is
`blocks="refresh"` decoding, the generator's default: a candidate decoded here in any batch
follows the same steps as `MaskPredictGenerator` decoding it alone.

The K/V held at once is that of the candidates of one block step; the scheduler's `max_rows`
bounds it. This is the decoder of an HF export (its transformers cache has no pool slots); a
megatron checkpoint is served by `slot_decoder.SlotPoolBlockDecoder`.
"""
from __future__ import annotations

from typing import Sequence

import torch

from megatron_biglm.generation.blocks import Candidate, absorb_block
from megatron_biglm.generation.config import GenerationConfig
from megatron_biglm.generation.mask_predict import decode_block
from megatron_biglm.generation.slot_forward import SlotForward


class ExactCacheBlockDecoder:
    """Decodes blocks with `adapter` (a `MaskedLMAdapter`), with its prefix cache when exact.
    Nothing is held between blocks, so only `blocks="refresh"` is served."""

    block_modes = ("refresh",)

    def __init__(self, adapter):
        self.adapter = adapter
        self.use_cache = bool(adapter.prefix_cache)
        self.mask_id = int(adapter.special.mask_id)
        eos = adapter.special.eos_id
        self.eos_id = None if eos is None else int(eos)

    def decode_block(self, candidates: Sequence[Candidate], config: GenerationConfig,
                     block_size: int, slot_offset: int) -> None:
        candidates = list(candidates)
        widths = [c.block_width(block_size) for c in candidates]
        forward = SlotForward(self.adapter, self.use_cache)
        with torch.no_grad():
            forward.set_prefixes([c.prefix + c.tokens for c in candidates])
            result = decode_block(forward, list(range(len(candidates))), widths, slot_offset, config,
                                  self.mask_id, self.eos_id, [c.generator for c in candidates])
        block = slot_offset // block_size
        absorb_block(candidates, widths, result, block, self.mask_id,
                     self.eos_id if config.eos_cut else None)

    def release(self, candidates: Sequence[Candidate]) -> None:
        """Nothing to give back: a block's keys/values are dropped when it ends."""
