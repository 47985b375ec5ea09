"""Decoding whole candidates block by block: the loop around `mask_predict.decode_block`.

A candidate is one `[BOS] + prompt` prefix and a number N of slots (one prompt has several
candidates under a length beam). Its slots are split into blocks of `block_size` (one block when
unset); block k is decoded with Mask-Predict, frozen, and appended to the prefix before block
k + 1 starts. Blocks after the open one do not exist yet: they are neither input nor keys.

How the finished block joins the prefix (`config.blocks`):
- "refresh": the new prefix `[BOS] + prompt + blocks <= k` is encoded from scratch, once per
  block, so every earlier row sees it (training's single split);
- "cached": the block's rows, with their final tokens, are appended to the cached prefix and
  see only what came before them (block-causal); the cache only grows. Without the cache the
  same pattern is recomputed from the ids at every iteration (the reference);
- "canvas" (LLaDA): there is no prefix; every iteration runs the whole canvas, later slots
  present as masks, with full attention (`slot_forward.CanvasForward`).

The first block's prefixes are encoded once per distinct prompt, however many candidates share
it. With an EOS cut, a candidate stops after the first block that holds an EOS.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .config import GenerationConfig
from .mask_predict import BlockResult, decode_block
from .slot_forward import CanvasForward, SlotForward


@dataclass
class Candidate:
    """Input: the prefix and slot count; output: tokens, log-confidences, passes, canvases."""

    prefix: list[int]
    n_slots: int
    generator: torch.Generator | None = None
    length_logprob: float = 0.0  # the length predictor's log-probability of n_slots
    tokens: list[int] = field(default_factory=list)
    logconf: list[float] = field(default_factory=list)
    iterations: int = 0
    canvases: list[tuple[int, int, list[int]]] = field(default_factory=list)  # (block, t, all N slots)
    stopped: bool = False

    def block_width(self, block_size: int) -> int:
        return 0 if self.stopped else min(block_size, self.n_slots - len(self.tokens))


def absorb_block(candidates: list[Candidate], widths: list[int], result: BlockResult, block: int,
                 mask_id: int, stop_eos_id: int | None) -> None:
    """Append row i of a decoded block (`widths[i]` slots) to `candidates[i]`: its tokens,
    log-confidences, passes and canvases; a candidate whose block holds `stop_eos_id` stops."""
    for i, c in enumerate(candidates):
        n = widths[i]
        new = result.tokens[i, :n].tolist()
        c.tokens += new
        c.logconf += result.logconf[i, :n].tolist()
        c.iterations += result.iterations[i]
        if result.canvases is not None:
            done = len(c.tokens) - n
            for canvas in result.canvases:
                if bool(canvas.ran[i]):
                    later = [mask_id] * (c.n_slots - done - n)
                    c.canvases.append((block, canvas.iteration, c.tokens[:done]
                                       + canvas.tokens[i, :n].tolist() + later))
        if stop_eos_id is not None and stop_eos_id in new:
            c.stopped = True


def decode_candidates(adapter, candidates: list[Candidate], config: GenerationConfig,
                      use_cache: bool) -> SlotForward | CanvasForward:
    """Fill every candidate in place; returns the forward (its `prefix_passes` is the cost)."""
    special = adapter.special
    mask_id, eos_id = int(special.mask_id), special.eos_id
    eos_id = None if eos_id is None else int(eos_id)
    block_size = config.block_size or max(c.n_slots for c in candidates)
    whole_canvas = config.blocks == "canvas"
    forward = CanvasForward(adapter) if whole_canvas else SlotForward(
        adapter, use_cache, block_causal=config.blocks == "cached" and any(c.n_slots > block_size for c in candidates))
    stop_at_eos = config.eos_cut and eos_id is not None

    active = [c for c in candidates if c.block_width(block_size) > 0]
    distinct = list(dict.fromkeys(tuple(c.prefix) for c in active))
    if not whole_canvas:
        forward.set_prefixes([list(p) for p in distinct])
    rows = [distinct.index(tuple(c.prefix)) for c in active]
    block = 0
    while active:
        widths = [c.block_width(block_size) for c in active]
        if whole_canvas:
            forward.set_canvases([c.prefix + c.tokens for c in active],
                                 [c.n_slots - len(c.tokens) - n for c, n in zip(active, widths)])
            rows = list(range(len(active)))
        result = decode_block(forward, rows, widths, block * block_size, config, mask_id, eos_id,
                              [c.generator for c in active])
        absorb_block(active, widths, result, block, mask_id, eos_id if stop_at_eos else None)
        going = [i for i, c in enumerate(active) if c.block_width(block_size) > 0]
        if whole_canvas:
            pass  # the next block's canvases are set when it starts
        elif going and config.blocks == "cached":
            forward.extend([rows[i] for i in going], [active[i].tokens[-widths[i]:] for i in going])
        elif going:
            forward.set_prefixes([active[i].prefix + active[i].tokens for i in going])
        active = [active[i] for i in going]
        rows = list(range(len(active)))
        block += 1
    return forward
