"""Choosing a token for each predicted slot, and the confidence that ranks it.

Two distributions on purpose:
- the *confidence* of a slot is the model's probability of the chosen token under the plain
  softmax of its logits (temperature 1, no top-k/top-p), after the hard constraints below. It is
  what re-masking ranks and what the length beam averages (in log space), so it means the same
  thing whether the token was picked greedily or sampled (LLaDA does the same).
- the *choice* is the argmax (temperature 0) or a draw from softmax(logits / temperature)
  restricted by top-k / top-p, with the Gumbel-max trick in its exponential form (argmax of
  p / E, E ~ Exp(1)) on noise from the row's own generator. Each row draws noise for its own
  real slots only (the decoder asks only for the masked ones), so its draws are independent
  of the other rows and of the padding of the batch; the distributions are computed for the
  whole batch at once. (An inverse-CDF draw needs one number per slot instead of one per
  token, but a rounding difference anywhere in the cumulative sum moves it, so the same
  request could sample differently alone and batched.)

Hard constraints (applied to both): the mask token is never generated (a slot holding it would be
indistinguishable from a masked slot), and EOS is impossible in slots before `min_length`.
"""
from __future__ import annotations

import math

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
    if temperature == 0:
        tokens = logits.argmax(dim=-1)
    else:
        tokens = _draw(_filter(logits / temperature, top_k, top_p), widths, generators)
    picked = logits.gather(-1, tokens[..., None])[..., 0]
    return tokens, picked - torch.logsumexp(logits, dim=-1)


def _draw(scores: torch.Tensor, widths: list[int], generators: list[torch.Generator | None] | None
          ) -> torch.Tensor:
    """Tokens `[b, w]` drawn from softmax(scores): argmax of p / E with E ~ Exp(1) drawn per
    token (the Gumbel-max trick, as p / E = exp(score + Gumbel noise) / Z), so a draw only
    changes where two tokens' perturbed values nearly tie, however the batch around it rounds
    the logits. Row r's noise is drawn from `generators[r]` for its first `widths[r]` slots
    only; padding slots get none."""
    probs = torch.softmax(scores, dim=-1)
    uniform = torch.full_like(probs, math.exp(-1.0))  # padding slots: E = 1
    for r, width in enumerate(widths):
        gen = generators[r] if generators is not None else None
        uniform[r, :width].uniform_(generator=gen)
    # E = -log U (torch's own exponential_ is several times slower than uniform_ and one log)
    noise = uniform.clamp_(min=torch.finfo(uniform.dtype).tiny).log_().neg_()
    return (probs / noise).argmax(dim=-1)


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
