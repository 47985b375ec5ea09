"""Mask-Predict over one block of slots, for a batch of rows (Ghazvininejad et al., 2019).

All N slots of a row start as `<mask>`. At iteration t = 1..T every masked slot is predicted
(see `sampling`; the model's head and the draws run at the masked slots only), and its token
and log-confidence are stored; slots that were not masked keep
the token and the confidence they were predicted with. Then floor(N * (T - t) / T) slots go back
to `<mask>` (see `remasking`). A row whose slots are all committed stops taking part in the
forward passes, so `iterations` counts the passes a row really cost.

Rows of a batch may have different widths (length-beam candidates, the last block); the slots
are right-padded and the padding is never predicted, ranked or counted.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from megatron_biglm.model.kv_pool import on_device

from . import remasking, sampling
from .config import GenerationConfig
from .slot_forward import SlotForward


@dataclass
class Canvas:
    """The block after iteration `iteration`: tokens `[a, w]` (`mask_id` where masked), the
    masked slots, and which rows ran in that iteration."""

    iteration: int
    tokens: torch.Tensor
    masked: torch.Tensor
    ran: torch.Tensor


@dataclass
class BlockResult:
    """Final tokens `[a, w]` and log-confidences `[a, w]` (CPU; padding is meaningless), the
    forward passes per row, and the canvases when asked for."""

    tokens: torch.Tensor
    logconf: torch.Tensor
    iterations: list[int]
    canvases: list[Canvas] | None


def decode_block(forward: SlotForward, rows: list[int], widths: list[int], slot_offset: int,
                 config: GenerationConfig, mask_id: int, eos_id: int | None,
                 generators: list[torch.Generator | None] | None) -> BlockResult:
    """Decode a block of `widths[i]` slots after prefix `rows[i]` of `forward`.

    `slot_offset` is the index of the block's first slot in the whole output (for min_length);
    `generators[i]` feeds row i's random draws (None: the global generator). The block runs on
    the forward's device (`run_block`); its result is read to the host once, at the end."""
    tokens, logconf, iterations, canvases = run_block(forward, rows, widths, slot_offset, config, mask_id,
                                                      eos_id, generators)
    return BlockResult(tokens.cpu(), logconf.cpu(), iterations, canvases)


def live_rows(widths: list[int], steps: int, t: int) -> list[int]:
    """The rows that still hold a masked slot when iteration `t` starts, without a confidence
    threshold: every mode re-masks exactly `masked_after(n, steps, t - 1)` of a row's n slots
    (all n are eligible under low_confidence and random; under none, the slots masked before,
    of which there are at least that many), so which rows run is known on the host."""
    return [i for i, n in enumerate(widths) if remasking.masked_after(n, steps, t - 1) > 0]


def run_block(forward: SlotForward, rows: list[int], widths: list[int], slot_offset: int,
              config: GenerationConfig, mask_id: int, eos_id: int | None,
              generators: list[torch.Generator | None] | None
              ) -> tuple[torch.Tensor, torch.Tensor, list[int], list[Canvas] | None]:
    """The iterations of one block on the forward's device: tokens `[a, w]` and log-confidences
    `[a, w]` (device tensors), the passes per row, the canvases when asked for.

    Sampling and re-masking stay on the device and nothing is read back inside the block: which
    rows still run is a host function of the widths and the schedule (`live_rows`), and every
    host-made index moves to the device without waiting. Two exceptions, both asked for: with a
    confidence threshold a row finishes when its slots are confident, so its live set is read
    once per iteration; `return_steps` copies each canvas to the host."""
    device = forward.device
    a, w = len(rows), max(widths)
    width_t = on_device(widths, device)
    valid = torch.arange(w, device=device)[None] < width_t[:, None]
    tokens = torch.full((a, w), mask_id, dtype=torch.long, device=device)
    masked = valid.clone()
    logconf: torch.Tensor | None = None
    slot_index = (slot_offset + torch.arange(w, device=device))[None].expand(a, -1)
    iterations = [0] * a
    canvases: list[Canvas] | None = [] if config.return_steps else None
    pad_id = forward.pad_id
    steps = config.steps

    for t in range(1, steps + 1):
        if config.confidence_threshold is None:
            live = live_rows(widths, steps, t)
        else:
            live = masked.any(dim=-1).nonzero()[:, 0].tolist()
        if not live:
            break
        live_t = on_device(live, device)
        sub_widths = [widths[i] for i in live]
        sub_gens = [generators[i] for i in live] if generators is not None else None
        ws = max(sub_widths)
        was_masked = masked[live_t]
        inputs = torch.where(was_masked, mask_id, tokens[live_t]).masked_fill(~valid[live_t], pad_id)[:, :ws]
        # only the masked slots are predicted: they come first in each row, in slot order; how
        # many a row holds is the schedule's (`live_rows`), read back only under a threshold
        if config.confidence_threshold is None:
            predicted_n = [remasking.masked_after(n, steps, t - 1) for n in sub_widths]
        else:
            predicted_n = was_masked[:, :ws].sum(dim=-1).tolist()
        predicted = on_device(predicted_n, device)
        k = max(predicted_n)
        wanted = (~was_masked[:, :ws]).to(torch.uint8).argsort(dim=-1, stable=True)[:, :k]
        logits = forward.logits([rows[i] for i in live], inputs, sub_widths, wanted)
        logits = sampling.constrain(logits, slot_index[live_t].gather(1, wanted), mask_id, eos_id,
                                    config.min_length)
        picked, picked_conf = sampling.choose(
            logits, predicted_n, temperature=config.temperature, top_k=config.top_k,
            top_p=config.top_p, generators=sub_gens)
        if logconf is None:
            logconf = torch.zeros((a, w), dtype=picked_conf.dtype, device=device)
        real = torch.arange(k, device=device)[None] < predicted[:, None]
        for store, new in ((tokens, picked), (logconf, picked_conf)):
            rows_now = store[live_t]
            kept = rows_now.gather(1, wanted)  # what the padding entries write back
            rows_now.scatter_(1, wanted, torch.where(real, new.to(store.dtype), kept))
            store[live_t] = rows_now
        for i in live:
            iterations[i] += 1

        counts = on_device([remasking.masked_after(n, steps, t) for n in sub_widths], device)
        if config.remask == "none":
            eligible, mode = was_masked, "low_confidence"
        else:
            eligible, mode = valid[live_t], config.remask
        masked[live_t] = remasking.select(logconf[live_t], eligible, counts, mode, sub_widths,
                                          sub_gens, config.confidence_threshold)
        if canvases is not None:
            ran = torch.zeros(a, dtype=torch.bool)
            ran[live] = True
            # a copy: on CPU `.cpu()` is the same tensor, which later iterations change in place
            canvases.append(Canvas(t, torch.where(masked, mask_id, tokens).cpu(), masked.to("cpu", copy=True), ran))

    assert logconf is not None  # every row has >= 1 slot, so iteration 1 always runs
    return tokens, logconf, iterations, canvases

