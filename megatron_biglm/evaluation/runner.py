"""Runs scoring rules over many requests: the rounds of the rules, on the inference engine.

Requests that share a prefix (the choices of one multiple-choice question) form a group, and
chunks of groups go through the engine (`megatron_biglm.inference.engine`: grouping, padded
batches, prefix reuse). Within a chunk all requests advance round by round; each round's
queries run as engine rows, and only per-position scalars (log p(gold), argmax, max log-prob)
come back to the rules. With prefix reuse, the chunk's distinct prefixes are encoded once and
every query of every round runs only its suffix rows against the cached keys/values: this is
exact because under split attention prefix rows never see the suffix.
"""
from __future__ import annotations

from typing import Sequence

import torch
from tqdm.auto import tqdm

from megatron_biglm.inference.engine import PrefixCache, Row, check_prefix_cache, group_by_prefix, pad, run_rows
from megatron_biglm.inference.protocol import MaskedLMAdapter

from .scoring import Query, QueryStats, RequestScoring, ScoreRequest, ScoreResult, ScoringRule


def score_requests(adapter: MaskedLMAdapter, requests: Sequence[ScoreRequest], rule: ScoringRule,
                   *, batch_size: int = 16, prefix_reuse: bool = False, progress: bool = False,
                   desc: str | None = None) -> list[ScoreResult]:
    """Score every request with `rule`; results come back in request order."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if prefix_reuse:
        check_prefix_cache(adapter)
    _check_lengths(adapter, requests)
    results: list[ScoreResult | None] = [None] * len(requests)
    bar = tqdm(total=len(requests), disable=not progress, desc=desc or f"scoring ({rule.name})")
    sizes = [_total(r) for r in requests]
    with torch.inference_mode():
        for chunk in group_by_prefix([r.prefix for r in requests], sizes, batch_size):
            states = {i: rule.start(requests[i]) for i in chunk}
            cache = (PrefixCache.encode(adapter, [requests[i].prefix for i in chunk])
                     if prefix_reuse else None)
            while True:
                for i in [i for i, s in states.items() if s.done]:
                    results[i] = states.pop(i).result
                    bar.update(1)
                if not states:
                    break
                _run_round(adapter, requests, states, cache, batch_size)
    bar.close()
    return results  # type: ignore[return-value]


def _total(r: ScoreRequest) -> int:
    return len(r.prefix) + len(r.continuation) + len(r.tail)


def _check_lengths(adapter: MaskedLMAdapter, requests: Sequence[ScoreRequest]) -> None:
    for r in requests:
        if _total(r) > adapter.max_length:
            raise ValueError(f"request of {_total(r)} tokens exceeds the model's max_length "
                             f"{adapter.max_length}; truncate the context before scoring")


def _run_round(adapter: MaskedLMAdapter, requests: Sequence[ScoreRequest],
               states: dict[int, RequestScoring], cache: PrefixCache | None, batch_size: int) -> None:
    asked: list[Query] = []
    rows: list[Row] = []
    per_state: dict[int, int] = {}
    for i, state in states.items():
        queries = state.pending()
        per_state[i] = len(queries)
        asked.extend(queries)
        rows.extend(Row(requests[i].prefix, q.suffix, q.positions) for q in queries)

    def reduce(logits: torch.Tensor, indices: list[int]) -> list[QueryStats]:
        return _stats(logits, [asked[k] for k in indices])

    stats = run_rows(adapter, rows, reduce, batch_size=batch_size, cache=cache)
    cursor = 0
    for i, state in states.items():
        n = per_state[i]
        state.update(stats[cursor:cursor + n])
        cursor += n


def _stats(logits: torch.Tensor, queries: list[Query]) -> list[QueryStats]:
    """log-softmax at the asked positions; only per-position scalars leave this function."""
    targets, _ = pad([list(q.targets) for q in queries], 0, logits.device)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    gold = logprobs.gather(-1, targets[..., None]).squeeze(-1)
    best, argmax = logprobs.max(dim=-1)
    gold, best, argmax = gold.double().tolist(), best.double().tolist(), argmax.tolist()
    out = []
    for r, q in enumerate(queries):
        k = len(q.positions)
        out.append(QueryStats(tuple(gold[r][:k]), tuple(argmax[r][:k]), tuple(best[r][:k])))
    return out
