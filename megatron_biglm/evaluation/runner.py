"""Runs scoring rules over many requests: grouping, batching, prefix reuse, progress.

Requests that share a prefix (the choices of one multiple-choice question) form a group. Groups
are sorted longest first and taken a chunk at a time (about `batch_size` requests). Within a
chunk all requests advance round by round; each round's queries are sorted by length, padded,
and run `batch_size` rows at a time. With prefix reuse, the chunk's distinct prefixes are
encoded once and every query of every round runs only its suffix rows against the cached
keys/values: this is exact because under split attention prefix rows never see the suffix.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import torch
from tqdm.auto import tqdm

from .protocol import MaskedLMAdapter
from .scoring import Query, QueryStats, RequestScoring, ScoreRequest, ScoreResult, ScoringRule


def score_requests(adapter: MaskedLMAdapter, requests: Sequence[ScoreRequest], rule: ScoringRule,
                   *, batch_size: int = 16, prefix_reuse: bool = False, progress: bool = False,
                   desc: str | None = None) -> list[ScoreResult]:
    """Score every request with `rule`; results come back in request order."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if prefix_reuse and not (adapter.prefix_cache and adapter.split_attention):
        raise ValueError("prefix reuse needs an adapter with split attention and a prefix cache "
                         f"(this one: split_attention={adapter.split_attention}, "
                         f"prefix_cache={adapter.prefix_cache})")
    _check_lengths(adapter, requests)
    results: list[ScoreResult | None] = [None] * len(requests)
    bar = tqdm(total=len(requests), disable=not progress, desc=desc or f"scoring ({rule.name})")
    with torch.inference_mode():
        for chunk in _chunks(requests, batch_size):
            states = {i: rule.start(requests[i]) for i in chunk}
            cache = _encode_prefixes(adapter, [requests[i] for i in chunk]) if prefix_reuse else None
            while True:
                for i in [i for i, s in states.items() if s.done]:
                    results[i] = states.pop(i).result
                    bar.update(1)
                if not states:
                    break
                _run_round(adapter, requests, states, cache, batch_size)
    bar.close()
    return results  # type: ignore[return-value]


def _check_lengths(adapter: MaskedLMAdapter, requests: Sequence[ScoreRequest]) -> None:
    for r in requests:
        total = len(r.prefix) + len(r.continuation) + len(r.tail)
        if total > adapter.max_length:
            raise ValueError(f"request of {total} tokens exceeds the model's max_length "
                             f"{adapter.max_length}; truncate the context before scoring")


def _chunks(requests: Sequence[ScoreRequest], batch_size: int) -> list[list[int]]:
    groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i, r in enumerate(requests):
        groups[r.prefix].append(i)

    def longest(members: list[int]) -> int:
        return max(len(requests[i].prefix) + len(requests[i].continuation) + len(requests[i].tail)
                   for i in members)

    chunks, current = [], []
    for members in sorted(groups.values(), key=lambda m: (-longest(m), m[0])):
        current.extend(members)
        if len(current) >= batch_size:
            chunks.append(current)
            current = []
    if current:
        chunks.append(current)
    return chunks


class _PrefixCache:
    """The adapter's state for a chunk's distinct prefixes, and which row each prefix is."""

    def __init__(self, state, row_of: dict[tuple[int, ...], int]):
        self.state, self.row_of = state, row_of


def _encode_prefixes(adapter: MaskedLMAdapter, requests: list[ScoreRequest]) -> _PrefixCache:
    prefixes = list(dict.fromkeys(r.prefix for r in requests))
    ids, lengths = _pad([list(p) for p in prefixes], adapter.special.pad_id, adapter.device)
    return _PrefixCache(adapter.encode_prefix(ids, lengths), {p: k for k, p in enumerate(prefixes)})


def _run_round(adapter: MaskedLMAdapter, requests: Sequence[ScoreRequest],
               states: dict[int, RequestScoring], cache: _PrefixCache | None, batch_size: int) -> None:
    asked: list[tuple[int, Query]] = []
    per_state: dict[int, list[Query]] = {}
    for i, state in states.items():
        per_state[i] = state.pending()
        asked.extend((i, q) for q in per_state[i])

    def row_length(item: tuple[int, Query]) -> int:
        i, q = item
        return len(q.suffix) + (0 if cache else len(requests[i].prefix))

    order = sorted(range(len(asked)), key=lambda k: -row_length(asked[k]))
    stats: list[QueryStats | None] = [None] * len(asked)
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        rows = [asked[k] for k in batch]
        out = (_forward_cached(adapter, cache, requests, rows) if cache
               else _forward_full(adapter, requests, rows))
        for k, st in zip(batch, out):
            stats[k] = st
    cursor = 0
    for i, state in states.items():
        n = len(per_state[i])
        state.update(stats[cursor:cursor + n])  # type: ignore[arg-type]
        cursor += n


def _forward_full(adapter: MaskedLMAdapter, requests, rows) -> list[QueryStats]:
    seqs = [list(requests[i].prefix) + list(q.suffix) for i, q in rows]
    ids, lengths = _pad(seqs, adapter.special.pad_id, adapter.device)
    split = (torch.tensor([len(requests[i].prefix) for i, _ in rows], device=adapter.device)
             if adapter.split_attention else None)
    positions = [[len(requests[i].prefix) + p for p in q.positions] for i, q in rows]
    pos, _ = _pad(positions, 0, adapter.device)
    logits = adapter.logits(ids, lengths, split, pos)
    return _stats(logits, rows)


def _forward_cached(adapter: MaskedLMAdapter, cache: _PrefixCache, requests, rows) -> list[QueryStats]:
    suffix, suffix_lengths = _pad([list(q.suffix) for _, q in rows], adapter.special.pad_id,
                                  adapter.device)
    prefix_rows = torch.tensor([cache.row_of[requests[i].prefix] for i, _ in rows],
                               device=adapter.device)
    pos, _ = _pad([list(q.positions) for _, q in rows], 0, adapter.device)
    logits = adapter.logits_with_prefix(cache.state, prefix_rows, suffix, suffix_lengths, pos)
    return _stats(logits, rows)


def _stats(logits: torch.Tensor, rows) -> list[QueryStats]:
    """log-softmax at the asked positions; only per-position scalars leave this function."""
    targets, _ = _pad([list(q.targets) for _, q in rows], 0, logits.device)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    gold = logprobs.gather(-1, targets[..., None]).squeeze(-1)
    best, argmax = logprobs.max(dim=-1)
    gold, best, argmax = gold.double().tolist(), best.double().tolist(), argmax.tolist()
    out = []
    for r, (_, q) in enumerate(rows):
        k = len(q.positions)
        out.append(QueryStats(tuple(gold[r][:k]), tuple(argmax[r][:k]), tuple(best[r][:k])))
    return out


def _pad(seqs: list[list[int]], value: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), width), value, dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, :len(s)] = torch.tensor(s, dtype=torch.long)
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    return ids.to(device), lengths.to(device)
