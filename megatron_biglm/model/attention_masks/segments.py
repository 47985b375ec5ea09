"""The split rule as contiguous segments: only the visible (query, key) pairs are computed.

Under :func:`~megatron_biglm.objective.split_rule.visible`, sample i (prefix length p, valid
length v, sequence length s) is exactly two dense, non-causal blocks:

    prefix rows [0, p)  x  keys [0, p)
    suffix rows [p, s)  x  keys [0, v)    (padded rows t >= v are suffix rows: they see the
                                           valid keys, as every other representation has them)

so p² + (s − p)·v pairs instead of s². Two kernels run these blocks:

* :class:`SplitGroups` — two SDPA calls per group of samples that share (p, v): samples are
  grouped, not looped one by one, because fine-tuning and evaluation batches often repeat a
  split (a fixed prompt length) and then the calls per layer stay at two; pretraining draws a
  split per sample, and then each group is one sample (2·b calls per layer, each a dense
  flash/cuDNN SDPA call with no mask);
* :class:`VarlenSegments` — one variable-length call over all samples: the queries keep their
  natural ``[b*s]`` order, split into segments [prefix_i, suffix_i], and the keys/values are
  gathered as [k_i[:p], k_i[:v]] per sample (the prefix K/V referenced twice), so the call's
  ``cu_seq_q`` and ``cu_seq_k`` differ.

Both are derived from the split on the host (the loader's CPU tensor: no device sync) and
build no s x s tensor.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from megatron_biglm.objective.split_rule import CheckedSplit, checked_split


def _host_checked(split, seq_len: int, valid_lengths) -> tuple[torch.Tensor, torch.Tensor]:
    """``(split, valid)`` on the host, checked (a :class:`CheckedSplit` already is)."""
    if isinstance(split, CheckedSplit):
        return checked_split(split.to("cpu"), seq_len)
    return checked_split(split.cpu(), seq_len, None if valid_lengths is None else valid_lengths.cpu())


@dataclass(frozen=True)
class SplitGroups:
    """Samples grouped by (prefix length, valid length): ``groups[j] = (sample indices, p, v)``."""

    batch_size: int
    seq_len: int
    groups: tuple

    def index(self, j: int, device) -> torch.Tensor | None:
        """Group j's sample indices on `device`, or None when it is the whole batch in order."""
        samples = self.groups[j][0]
        if samples == tuple(range(self.batch_size)):
            return None
        return torch.tensor(samples, dtype=torch.long).to(device, non_blocking=True)


def split_groups(split: torch.Tensor, seq_len: int, *, valid_lengths: torch.Tensor | None = None) -> SplitGroups:
    """The :class:`SplitGroups` of a batch (pass the host tensors: reading them is free there)."""
    split, valid = _host_checked(split, seq_len, valid_lengths)
    by_key: dict[tuple[int, int], list[int]] = {}
    for i, key in enumerate(zip(split.tolist(), valid.tolist())):
        by_key.setdefault(key, []).append(i)
    return SplitGroups(split.shape[0], seq_len, tuple((tuple(ix), p, v) for (p, v), ix in by_key.items()))


@dataclass(frozen=True)
class VarlenSegments:
    """One varlen call: q in natural ``[b*s]`` order cut at ``cu_seq_q``; keys/values gathered
    with ``kv_index`` and cut at ``cu_seq_k``. Segment 2i is sample i's prefix, 2i+1 its suffix."""

    batch_size: int
    seq_len: int
    cu_seq_q: torch.Tensor   # int32 [2b+1]
    cu_seq_k: torch.Tensor   # int32 [2b+1]
    kv_index: torch.Tensor   # int64 [sum(p + v)], rows of the packed [b*s] keys
    max_q: int
    max_k: int

    def to(self, device) -> "VarlenSegments":
        return VarlenSegments(self.batch_size, self.seq_len, *(t.to(device, non_blocking=True) for t in (
            self.cu_seq_q, self.cu_seq_k, self.kv_index)), self.max_q, self.max_k)


def varlen_segments(split: torch.Tensor, seq_len: int, *, valid_lengths: torch.Tensor | None = None) -> VarlenSegments:
    """The :class:`VarlenSegments` of a batch, built on the host (then moved with `.to`)."""
    split, valid = _host_checked(split, seq_len, valid_lengths)
    b, s = split.shape[0], seq_len
    q_lengths = torch.stack([split, s - split], dim=1).reshape(-1)
    k_lengths = torch.stack([split, valid], dim=1).reshape(-1)
    starts = (torch.arange(b) * s).repeat_interleave(2)
    pos = torch.arange(s)
    kv_index = torch.cat([starts[j] + pos[:int(n)] for j, n in enumerate(k_lengths.tolist())]) if b else \
        torch.zeros(0, dtype=torch.long)
    zero = torch.zeros(1, dtype=torch.int32)
    return VarlenSegments(
        batch_size=b, seq_len=s,
        cu_seq_q=torch.cat([zero, q_lengths.cumsum(0).to(torch.int32)]),
        cu_seq_k=torch.cat([zero, k_lengths.cumsum(0).to(torch.int32)]),
        kv_index=kv_index, max_q=int(q_lengths.max()) if b else 0, max_k=int(k_lengths.max()) if b else 0)


def grouped_split_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: SplitGroups, sdpa) -> torch.Tensor:
    """Split attention for ``q, k, v`` in ``[b, heads, s, dim]`` with two `sdpa(q, k, v)` calls
    per group (a call is skipped where its block is empty). Returns ``[b, heads, s, dim_v]``."""
    if len(groups.groups) == 1 and groups.index(0, q.device) is None:
        _, p, valid = groups.groups[0]
        return _two_blocks(q, k, v, p, valid, sdpa)
    out = q.new_empty(*q.shape[:-1], v.shape[-1])
    for j, (_, p, valid) in enumerate(groups.groups):
        ix = groups.index(j, q.device)
        part = _two_blocks(q.index_select(0, ix), k.index_select(0, ix), v.index_select(0, ix), p, valid, sdpa)
        out = out.index_copy(0, ix, part)
    return out


def _two_blocks(q, k, v, p: int, valid: int, sdpa) -> torch.Tensor:
    parts = []
    if p > 0:
        parts.append(sdpa(q[:, :, :p], k[:, :, :p], v[:, :, :p]))
    if p < q.shape[2]:
        parts.append(sdpa(q[:, :, p:], k[:, :, :valid], v[:, :, :valid]))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def varlen_split_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: VarlenSegments,
                           varlen_fn, softmax_scale: float | None = None) -> torch.Tensor:
    """Split attention for ``q, k, v`` in ``[b, s, heads, dim]`` with one call of `varlen_fn`
    (flash-attn's ``flash_attn_varlen_func`` signature: q, k, v, cu_q, cu_k, max_q, max_k,
    softmax_scale=, causal=). Returns ``[b, s, heads, dim_v]``."""
    b, s = q.shape[:2]
    if (b, s) != (segments.batch_size, segments.seq_len):
        raise ValueError(f"q has batch/seq {(b, s)} but the segments were built for "
                         f"{(segments.batch_size, segments.seq_len)}")
    qp = q.reshape(b * s, *q.shape[2:])
    kp = k.reshape(b * s, *k.shape[2:]).index_select(0, segments.kv_index)
    vp = v.reshape(b * s, *v.shape[2:]).index_select(0, segments.kv_index)
    out = varlen_fn(qp, kp, vp, segments.cu_seq_q, segments.cu_seq_k, segments.max_q, segments.max_k,
                    softmax_scale=softmax_scale, causal=False)
    return out.view(b, s, q.shape[2], v.shape[-1])
