"""How many slots to decode: fixed lengths, the length beam, and the length-predictor hook.

Candidate lengths of a prompt, best first:
- `length=N`: N alone, or under a length beam of L, the L lengths nearest to N
  (N, N-1, N+1, N-2, ...; never below 1);
- no `length` but a length predictor (CMLM's length head, classifying the target length from
  the prefix): its top-L lengths, each capped at `max_new_tokens` when that is given;
- otherwise `max_new_tokens` (one candidate, cut at EOS afterwards).

The predictor hook is any callable `predict(prefix_ids [g, p], prefix_lengths [g], k) ->
lengths [g, k]` (best first, right-padded prefixes `[BOS] + prompt` on the adapter's device),
so the head added to the model later plugs in without touching the decoder.

The winner among a prompt's candidates is the one with the highest *mean* log-confidence
(1/N) sum log p_i, the paper's rule; a tie goes to the better-ranked length.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from .config import GenerationConfig

LengthPredictor = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def lengths_around(length: int, beam: int) -> list[int]:
    """The `beam` lengths nearest to `length`, nearest first, all >= 1."""
    out, step = [length], 1
    while len(out) < beam:
        for value in (length - step, length + step):
            if value >= 1 and len(out) < beam:
                out.append(value)
        step += 1
    return out


def candidate_lengths(config: GenerationConfig, prefixes: Sequence[Sequence[int]],
                      predictor: LengthPredictor | None, pad_id: int,
                      device: torch.device) -> list[list[int]]:
    """Candidate lengths per prefix, best first (see module docstring)."""
    if config.length is not None:
        return [lengths_around(config.length, config.length_beam) for _ in prefixes]
    if predictor is None:
        return [[config.max_new_tokens] for _ in prefixes]
    width = max(len(p) for p in prefixes)
    ids = torch.full((len(prefixes), width), pad_id, dtype=torch.long, device=device)
    for i, p in enumerate(prefixes):
        ids[i, :len(p)] = torch.tensor(list(p), dtype=torch.long, device=device)
    lengths = torch.tensor([len(p) for p in prefixes], dtype=torch.long, device=device)
    predicted = predictor(ids, lengths, config.length_beam)
    if tuple(predicted.shape) != (len(prefixes), config.length_beam):
        raise ValueError(f"the length predictor returned shape {tuple(predicted.shape)}, expected "
                         f"{(len(prefixes), config.length_beam)} (prompts x length_beam)")
    out = []
    for row in predicted.tolist():
        cap = config.max_new_tokens
        row = [max(1, int(n)) if cap is None else min(cap, max(1, int(n))) for n in row]
        out.append(list(dict.fromkeys(row)))  # capping may merge candidates; keep rank order
    return out


def mean_logprob(logconf: Sequence[float]) -> float:
    return sum(logconf) / len(logconf)


def best(scores: Sequence[float]) -> int:
    """Index of the highest score; the first (best-ranked length) on ties."""
    return max(range(len(scores)), key=lambda i: (scores[i], -i))
