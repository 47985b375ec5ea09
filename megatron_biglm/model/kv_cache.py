"""Exact prefix key/value cache for BiGLM's megatron model (inference, TP=1/PP=1).

Why exact: under split attention prefix rows never attend to the suffix, so their keys and
values (post-RoPE, per layer) are the same whatever suffix follows. A forward over suffix rows
only, attending to `[cached prefix keys, suffix keys]`, therefore gives the logits of the full
split-attention forward. The same holds block by block (generation): a block whose rows see the
cached prefix and the block itself can be appended to the cache (`PrefixKV` grows), and no
cached row ever changes.

How it reaches megatron's layers: the model's forward takes `kv_cache=KVCacheForward(...)`,
asks it for one `LayerKV` port per layer (`layer_ports`) before any layer runs, and hands each
layer's core attention its port (`core_attention.kv_ports_attached`); `BiGLMCoreAttention`
passes its post-RoPE key/value to the port, which records them and returns the keys/values to
attend to (cached + new). A port holds tensors and host numbers fixed for the forward, and no
bookkeeping of its own, so a compiled layer traces the same code for every layer and call. The model shifts RoPE so suffix row j sits at position
`prefix_length + j` of its own row, and builds the mask "every real key" (all queries are past
the split, so the split rule reduces to key validity). Layout as megatron's: `[s, b, heads, d]`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, runtime_checkable

import torch

from megatron_biglm.objective.split_rule import visible


@runtime_checkable
class LayerKV(Protocol):
    """One layer's part of a cached forward: takes the layer's post-RoPE `key`/`value`
    `[q, b, ng, d]` and returns the keys/values to attend to."""

    def update(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class LayerPorts(Protocol):
    """A forward's kv_cache hook: one `LayerKV` per layer, resolved before the layers run."""

    def layer_ports(self, num_layers: int, q: int) -> list[LayerKV]: ...


@dataclass(frozen=True)
class PrefixKV:
    """Per layer (in layer order) post-RoPE keys and values `[w, g, ng, d]` of `g` cached,
    right-aligned-padded rows, and their real lengths `lengths [g]`."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    lengths: torch.Tensor

    @property
    def width(self) -> int:
        return int(self.keys[0].shape[0]) if self.keys else 0

    def select(self, rows: torch.Tensor) -> "PrefixKV":
        """The cached rows `rows [b]` (repeats allowed, on any device), in that order."""
        rows = rows.to(self.lengths.device, non_blocking=True)
        return PrefixKV(tuple(k.index_select(1, rows) for k in self.keys),
                        tuple(v.index_select(1, rows) for v in self.values),
                        self.lengths.index_select(0, rows))


def append_right_padded(past: torch.Tensor, past_lengths: torch.Tensor, new: torch.Tensor,
                        new_lengths: torch.Tensor, *, seq_dim: int, batch_dim: int) -> torch.Tensor:
    """Row b of the result: `past[b, :past_lengths[b]]` then `new[b, :new_lengths[b]]`, right
    padded to the longest total (padding slots hold copies of real entries; they are masked).

    Shared by every adapter that grows a cache (megatron `[s, b, h, d]`, HF `[b, h, s, d]`)."""
    width = past.shape[seq_dim]
    total = int((past_lengths + new_lengths).max())
    j = torch.arange(total, device=past.device)[None, :]  # [1, total]
    pl = past_lengths[:, None].to(past.device)
    index = torch.where(j < pl, j, width + (j - pl))
    index = index.clamp(max=width + new.shape[seq_dim] - 1)  # [b, total]
    both = torch.cat([past, new], dim=seq_dim)
    shape = [1] * both.dim()
    shape[batch_dim], shape[seq_dim] = index.shape[0], total
    index = index.reshape(shape) if batch_dim < seq_dim else index.t().reshape(shape)
    return both.gather(seq_dim, index.expand(*[total if d == seq_dim else both.shape[d]
                                               for d in range(both.dim())]))


class KVCacheForward:
    """What one forward does with the cache.

    `past`: cached rows to attend to (already `select`ed to this batch's rows), or None (the
    forward encodes fresh prefixes). `record`: keep this forward's keys/values, for
    `recorded()` (a fresh prefix) or `extended()` (past + this block)."""

    def __init__(self, past: Optional[PrefixKV] = None, *, record: bool = True):
        self.past = past
        self.record = record
        self._ports: list[_CachePort] = []

    def layer_ports(self, num_layers: int, q: int) -> list["_CachePort"]:
        """One port per layer (in layer order) for this forward's `q` rows."""
        if self.past is not None and num_layers > len(self.past.keys):
            raise ValueError(f"the cache holds {len(self.past.keys)} layers; the model has {num_layers} "
                             "(was it encoded by another model?)")
        past = self.past
        self._ports = [_CachePort(None if past is None else past.keys[i], None if past is None else past.values[i],
                                  self.record) for i in range(num_layers)]
        return self._ports

    def positions(self, q: int) -> Optional[torch.Tensor]:
        """RoPE positions `[b, q]` of this forward's rows, None for a fresh prefix (0..q-1)."""
        if self.past is None:
            return None
        return self.past.lengths[:, None] + torch.arange(q, device=self.past.lengths.device)[None]

    def allowed_keys(self, lengths: torch.Tensor, q: int) -> torch.Tensor:
        """Bool `[b, q, w + q]`, True where a query may attend, by the one split rule: this
        forward's rows all sit past the cached prefix (suffix rows, split 0 relative to them),
        so each sees every real cached key and every real key of this forward (`lengths [b]`
        real rows)."""
        past = self.past
        w = past.width
        dev = lengths.device
        cached = torch.arange(w, device=dev)[None] < past.lengths[:, None].to(dev)
        fresh = torch.arange(q, device=dev)[None] < lengths[:, None]
        key_real = torch.cat([cached, fresh], dim=1)[:, None, :]
        q_idx = (w + torch.arange(q, device=dev))[None, :, None]
        k_idx = torch.arange(w + q, device=dev)[None, None, :]
        return visible(q_idx, k_idx, 0, key_real=key_real)

    def position_limit(self, q: int) -> int:
        """One past the largest RoPE position of this forward's rows (a host read of the lengths)."""
        return int(self.past.lengths.max()) + q

    def masked_keys(self, lengths: torch.Tensor, q: int) -> torch.Tensor:
        """`allowed_keys` as the attention's dense mask: bool `[b, 1, q, w + q]`, True = masked."""
        return ~self.allowed_keys(lengths, q)[:, None]

    def _recorded_layers(self) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        if not self._ports or any(p.recorded is None for p in self._ports):
            raise RuntimeError("no keys/values were recorded: was the model's forward run with "
                               "this kv_cache (and record=True)?")
        return tuple(p.recorded[0] for p in self._ports), tuple(p.recorded[1] for p in self._ports)

    def recorded(self, lengths: torch.Tensor) -> PrefixKV:
        """The keys/values of this forward's rows (`lengths [b]` real), as a new cache."""
        keys, values = self._recorded_layers()
        return PrefixKV(keys, values, lengths)

    def extended(self, lengths: torch.Tensor) -> PrefixKV:
        """The past rows followed by this forward's rows (`lengths [b]` real), compacted."""
        if self.past is None:
            return self.recorded(lengths)
        keys, values = self._recorded_layers()
        grow = [append_right_padded(old, self.past.lengths, new, lengths, seq_dim=0, batch_dim=1)
                for old, new in zip(self.past.keys + self.past.values, keys + values)]
        n = len(keys)
        return PrefixKV(tuple(grow[:n]), tuple(grow[n:]), self.past.lengths + lengths)


class _CachePort:
    """One layer of a `KVCacheForward`: its cached keys/values (or None) and, when recording,
    the keys/values this forward gave it."""

    def __init__(self, past_keys: Optional[torch.Tensor], past_values: Optional[torch.Tensor], record: bool):
        self.past_keys, self.past_values, self.record = past_keys, past_values, record
        self.recorded: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    def update(self, key: torch.Tensor, value: torch.Tensor):
        if self.record:
            self.recorded = (key, value)
        if self.past_keys is None:
            return key, value
        return torch.cat([self.past_keys, key], dim=0), torch.cat([self.past_values, value], dim=0)
