"""The request batching engine: grouping by prefix, padded batches, the prefix cache.

Shared by scoring (`evaluation/runner.py` drives it round by round for the scoring rules) and
generation (Mask-Predict runs the open slots of many prompts against cached prefixes). What a
caller brings: rows `prefix + suffix` and the suffix positions whose logits it wants, and a
`reduce` that turns a batch's logits into whatever small per-row result it needs (log-probs at
gold tokens, argmax, ...), so vocabulary-sized logits never outlive one batch.

- `group_by_prefix`: requests that share a prefix (the choices of one question, the length
  candidates of one prompt) form a group; groups are sorted longest first and taken a chunk at
  a time (about `batch_size` requests), so a chunk's distinct prefixes can be cached together.
- `PrefixCache`: a chunk's distinct prefixes encoded once by the adapter (`encode_prefix`),
  and which cached row each prefix is. Exact under split attention: prefix rows never see
  the suffix (see `protocol.py`).
- `run_rows`: rows sorted by length (longest first), right padded and run `batch_size` at a
  time, either whole (`adapter.logits` with split = prefix length) or suffix only against the
  cache (`adapter.logits_with_prefix`).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence, TypeVar

import torch

from .buckets import bucket_width
from .protocol import MaskedLMAdapter

T = TypeVar("T")


@dataclass(frozen=True)
class Row:
    """One forward row: `prefix + suffix` ids; logits are wanted at `positions`, counted from
    the start of the suffix."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    positions: tuple[int, ...]


#: reduce(logits [b, k, V] at the batch rows' positions (padded to the longest k), indices of
#: those rows in the caller's list) -> one small result per row
Reduce = Callable[[torch.Tensor, list[int]], list[T]]


def pad(seqs: Sequence[Sequence[int]], value: int, device, *,
        adapter: MaskedLMAdapter | None = None, room: int | None = None
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded `[n, max(1, longest)]` long tensor and the lengths `[n]`; with `adapter`,
    the width is bucketed by its `length_buckets` (see `buckets.py`), within `room` positions
    (default: the adapter's max_length)."""
    width = max(1, max((len(s) for s in seqs), default=0))
    if adapter is not None:
        width = bucket_width(adapter, width, room)
    ids = torch.full((len(seqs), width), value, dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, :len(s)] = torch.tensor(list(s), dtype=torch.long)
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    # copies that do not make the host wait for the device (host memory is staged by torch)
    return ids.to(device, non_blocking=True), lengths.to(device, non_blocking=True)


def group_by_prefix(keys: Sequence[Hashable], sizes: Sequence[int], batch_size: int) -> list[list[int]]:
    """Chunks of request indices: requests with the same `keys[i]` (their prefix) stay in one
    chunk; groups go longest first (`sizes[i]`: the request's longest row), then by first
    index, and a chunk closes once it holds `batch_size` requests or more."""
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for i, key in enumerate(keys):
        groups[key].append(i)
    chunks, current = [], []
    for members in sorted(groups.values(), key=lambda m: (-max(sizes[i] for i in m), m[0])):
        current.extend(members)
        if len(current) >= batch_size:
            chunks.append(current)
            current = []
    if current:
        chunks.append(current)
    return chunks


class PrefixCache:
    """The adapter's cached state of distinct prefixes, and which cached row each prefix is."""

    def __init__(self, state, row_of: dict[tuple[int, ...], int]):
        self.state, self.row_of = state, row_of

    @classmethod
    def encode(cls, adapter: MaskedLMAdapter, prefixes: Sequence[tuple[int, ...]]) -> "PrefixCache":
        """Encode each distinct prefix once (in first-seen order)."""
        distinct = list(dict.fromkeys(tuple(p) for p in prefixes))
        ids, lengths = pad(distinct, adapter.special.pad_id, adapter.device, adapter=adapter)
        return cls(adapter.encode_prefix(ids, lengths), {p: k for k, p in enumerate(distinct)})

    def rows(self, prefixes: Sequence[tuple[int, ...]]) -> torch.Tensor:
        """The cached row of each prefix, on the host: a slot pool reads it there, the other
        caches move it to their device without waiting."""
        return torch.tensor([self.row_of[tuple(p)] for p in prefixes], dtype=torch.long)


def check_prefix_cache(adapter: MaskedLMAdapter) -> None:
    """ValueError unless the adapter can reuse prefixes exactly."""
    if not (adapter.prefix_cache and adapter.split_attention):
        raise ValueError("prefix reuse needs an adapter with split attention and a prefix cache "
                         f"(this one: split_attention={adapter.split_attention}, "
                         f"prefix_cache={adapter.prefix_cache})")


def run_rows(adapter: MaskedLMAdapter, rows: Sequence[Row], reduce: Reduce, *, batch_size: int,
             cache: PrefixCache | None = None) -> list[T]:
    """`reduce`'s result for every row, in row order. Rows run longest first (less padding),
    `batch_size` at a time; with `cache` only their suffixes run, against the cached prefixes."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")

    def length(k: int) -> int:
        return len(rows[k].suffix) + (0 if cache else len(rows[k].prefix))

    order = sorted(range(len(rows)), key=lambda k: -length(k))
    out: list = [None] * len(rows)
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        picked = [rows[k] for k in batch]
        logits = (_forward_cached(adapter, cache, picked) if cache
                  else _forward_full(adapter, picked))
        for k, result in zip(batch, reduce(logits, batch)):
            out[k] = result
    return out


def _forward_full(adapter: MaskedLMAdapter, rows: list[Row]) -> torch.Tensor:
    dev = adapter.device
    ids, lengths = pad([r.prefix + r.suffix for r in rows], adapter.special.pad_id, dev,
                       adapter=adapter)
    split = (torch.tensor([len(r.prefix) for r in rows], device=dev)
             if adapter.split_attention else None)
    positions, _ = pad([[len(r.prefix) + p for p in r.positions] for r in rows], 0, dev)
    return adapter.logits(ids, lengths, split, positions)


def _forward_cached(adapter: MaskedLMAdapter, cache: PrefixCache, rows: list[Row]) -> torch.Tensor:
    dev = adapter.device
    room = adapter.max_length - max(len(r.prefix) for r in rows)
    suffix, suffix_lengths = pad([r.suffix for r in rows], adapter.special.pad_id, dev,
                                 adapter=adapter, room=room)
    positions, _ = pad([r.positions for r in rows], 0, dev)
    return adapter.logits_with_prefix(cache.state, cache.rows([r.prefix for r in rows]),
                                      suffix, suffix_lengths, positions)
