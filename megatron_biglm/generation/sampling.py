"""Choosing a token for each predicted slot, and the confidence that ranks it.

Two distributions on purpose:
- the *confidence* of a slot is the model's probability of the chosen token under the plain
  softmax of its logits (temperature 1, no top-k/top-p), after the hard constraints below. It is
  what re-masking ranks and what the length beam averages (in log space), so it means the same
  thing whether the token was picked greedily or sampled (LLaDA does the same).
- the *choice* is the argmax (temperature 0) or a draw from softmax(logits / temperature)
  restricted by top-k / top-p, made with the Gumbel-max trick on noise from the row's own
  generator. Drawing per row, over the row's own slots only, keeps a row's draws independent of
  the other rows and of the padding of the batch.

Hard constraints (applied to both): the mask token is never generated (a slot holding it would be
indistinguishable from a masked slot), and EOS is impossible in slots before `min_length`.
"""
from __future__ import annotations

import torch


def constrain(logits: torch.Tensor, slot_index: torch.Tensor, mask_id: int, eos_id: int | None,
              min_length: int) -> torch.Tensor:
    """Logits `[b, w, V]` in at least fp32 with the forbidden tokens at -inf.

    `slot_index [b, w]` is each slot's index in the whole generated sequence (blocks included)."""
    out = logits.to(torch.promote_types(logits.dtype, torch.float32)).clone()
    out[..., mask_id] = float("-inf")
    if eos_id is not None and min_length > 0:
        early = slot_index < min_length
        out[..., eos_id] = out[..., eos_id].masked_fill(early, float("-inf"))
    return out


def choose(logits: torch.Tensor, widths: list[int], *, temperature: float, top_k: int | None,
           top_p: float | None, generators: list[torch.Generator | None] | None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens `[b, w]` and their log-confidence `[b, w]` from constrained logits `[b, w, V]`.

    Row r has `widths[r]` real slots; the rest is padding whose outputs are meaningless."""
    logp = torch.log_softmax(logits, dim=-1)
    if temperature == 0:
        tokens = logits.argmax(dim=-1)
    else:
        scores = _filter(logits / temperature, top_k, top_p)
        noise = torch.zeros_like(scores)
        for r, width in enumerate(widths):
            gen = generators[r] if generators is not None else None
            uniform = torch.rand((width, scores.shape[-1]), generator=gen, dtype=scores.dtype,
                                 device=scores.device)
            tiny = torch.finfo(scores.dtype).tiny
            noise[r, :width] = -torch.log(-torch.log(uniform.clamp(min=tiny, max=1.0 - 1e-7)))
        tokens = (scores + noise).argmax(dim=-1)
    return tokens, logp.gather(-1, tokens[..., None])[..., 0]


def _filter(scores: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """-inf outside the top-k tokens and outside the smallest prefix of mass >= top_p."""
    if top_k is not None and top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        ordered, order = scores.sort(dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the strictly better tokens
        drop_sorted = before >= top_p  # the best token has 0 before it, so it always stays
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores
