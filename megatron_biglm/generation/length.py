"""How many slots to decode: fixed lengths, the length beam, and the length-predictor hook.

Candidate lengths of a prompt, best first:
- `length=N`: N alone, or under a length beam of L, the L lengths nearest to N
  (N, N-1, N+1, N-2, ...; never below 1);
- no `length` but a length predictor (CMLM's length head, classifying the target length from
  the prefix): its top-L lengths, each capped at `max_new_tokens` when that is given;
- otherwise `max_new_tokens` (one candidate, cut at EOS afterwards).

The predictor hook is any callable `predict(prefix_ids [g, p], prefix_lengths [g], k) ->
LengthCandidates(lengths [g, k], logprobs [g, k])` (best first, right-padded prefixes
`[BOS] + prompt` on the adapter's device): an adapter's `predict_lengths`
(`inference.LengthPrediction`) or the caller's own.

The winner among a prompt's candidates has the highest score: the mean log-confidence of its
tokens (1/N) sum log p_i plus the predictor's log-probability of its length N (0 for fixed
lengths); a tie goes to the better-ranked length. The length term matters where the tokens
cannot tell lengths apart: a model that copies or reverses its source is as confident in a
prefix of the answer as in the whole of it, and mean confidence alone then picks a shorter,
wrong length about half the time. The head knows the length; the tokens know the content.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch

from .config import GenerationConfig

if TYPE_CHECKING:
    from megatron_biglm.model.heads import LengthCandidates

LengthPredictor = Callable[[torch.Tensor, torch.Tensor, int], "LengthCandidates"]


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
                      device: torch.device) -> list[dict[int, float]]:
    """Candidate lengths per prefix, best first, each with its log-probability under the
    predictor (0.0 when there is none); see the module docstring."""
    if config.length is not None:
        return [dict.fromkeys(lengths_around(config.length, config.length_beam), 0.0) for _ in prefixes]
    if predictor is None:
        return [{config.max_new_tokens: 0.0} for _ in prefixes]
    width = max(len(p) for p in prefixes)
    ids = torch.full((len(prefixes), width), pad_id, dtype=torch.long, device=device)
    for i, p in enumerate(prefixes):
        ids[i, :len(p)] = torch.tensor(list(p), dtype=torch.long, device=device)
    lengths = torch.tensor([len(p) for p in prefixes], dtype=torch.long, device=device)
    predicted = predictor(ids, lengths, config.length_beam)
    shape = tuple(predicted.lengths.shape)
    # fewer columns than the beam when the head knows fewer lengths than that (max_length < beam)
    if (len(shape) != 2 or shape[0] != len(prefixes) or not 1 <= shape[1] <= config.length_beam
            or tuple(predicted.logprobs.shape) != shape):
        raise ValueError(f"the length predictor returned lengths {shape} and log-probabilities "
                         f"{tuple(predicted.logprobs.shape)}, expected ({len(prefixes)}, k) with "
                         f"1 <= k <= length_beam={config.length_beam} for both")
    out = []
    cap = config.max_new_tokens
    for row, logps in zip(predicted.lengths.tolist(), predicted.logprobs.tolist()):
        merged: dict[int, float] = {}
        for n, logp in zip(row, logps):
            n = max(1, int(n)) if cap is None else min(cap, max(1, int(n)))
            # capping may merge candidates: keep the rank order, add up their probabilities
            merged[n] = logp if n not in merged else float(np.logaddexp(merged[n], logp))
        out.append(merged)
    return out


def mean_logprob(logconf: Sequence[float]) -> float:
    return sum(logconf) / len(logconf)


def best(scores: Sequence[float]) -> int:
    """Index of the highest score; the first (best-ranked length) on ties."""
    return max(range(len(scores)), key=lambda i: (scores[i], -i))
