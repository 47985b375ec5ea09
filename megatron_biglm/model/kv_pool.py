"""The exact K/V cache as a pool of preallocated per-request slots, written in place.

Why a pool: the growing cache (`kv_cache.PrefixKV`) re-gathers and re-concatenates every
layer's keys and values at every step (`select`, `torch.cat`), and its mask is a dense
`[b, q, w + q]` grid; on a GPU a cached step is then bound by those launches and copies, not
by the model. Here each request owns a slot of per-layer buffers `[capacity, slots, ng, d]`
(megatron's `[s, b, ng, d]` layout) sized for prompt plus output:

- a forward writes its rows' keys/values in place (each layer through its `SlotPort`, planned
  on the host before the layers run), at each slot's valid length onwards, and
  attends to the slot's buffer up to that length plus its own rows: a key-padding mask
  `[b, 1, 1, k]` (one length per row), no per-query mask;
- a block is committed by advancing the slot's length (the block's keys were written by the
  forward that decoded it, with its final tokens, exactly as the growing cache appends them);
- requests join (`allocate`) and leave (`release`) between blocks; a request that forks (two
  continuations of one prompt) gets a copy of its slot (`copy_slots`).

When the rows of a forward are distinct slots, their keys are written in place and the slots
read back by index (not as a slice: a compiled layer would specialise on the slice's start);
otherwise (one slot read by several rows, whose in-place writes would collide) the slots are
gathered and this forward's keys appended, as the growing cache does. The valid lengths live
on the host, so building a step reads nothing from the device.
Exactness: same keys, same positions, same visible set as the growing cache (tests compare
them token for token).
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch


@runtime_checkable
class KVSlots(Protocol):
    """What a server schedules requests on: slots of a fixed capacity, taken and given back
    between blocks, each with a valid length."""

    capacity: int

    def allocate(self, n: int) -> list[int]: ...

    def release(self, slots: Sequence[int]) -> None: ...

    def length(self, slot: int) -> int: ...


class KVSlotPool:
    """Per-layer key and value buffers `[capacity, slots, groups, head_dim]`, zero-filled (a
    masked key must hold finite numbers: softmax weight 0 times NaN is NaN), and each slot's
    valid length (host ints)."""

    def __init__(self, num_layers: int, num_slots: int, capacity: int, groups: int, head_dim: int,
                 dtype: torch.dtype, device):
        self.capacity = int(capacity)
        self.shape = (num_layers, groups, head_dim)
        self.dtype, self.device = dtype, torch.device(device)
        self.keys = [self._buffer(num_slots) for _ in range(num_layers)]
        self.values = [self._buffer(num_slots) for _ in range(num_layers)]
        self.lengths = [0] * num_slots
        self._free = list(range(num_slots))

    def _buffer(self, slots: int) -> torch.Tensor:
        _, groups, head_dim = self.shape
        return torch.zeros(self.capacity, slots, groups, head_dim, dtype=self.dtype, device=self.device)

    @property
    def num_slots(self) -> int:
        return len(self.lengths)

    def allocate(self, n: int) -> list[int]:
        """`n` free slots (length 0), lowest first, so a batch that joins together reads as a view;
        the pool doubles when it runs out."""
        if n > len(self._free):
            self._grow(max(self.num_slots, n - len(self._free)))
        self._free.sort()
        taken, self._free = self._free[:n], self._free[n:]
        for s in taken:
            self.lengths[s] = 0
        return taken

    def release(self, slots: Sequence[int]) -> None:
        for s in slots:
            if s in self._free:
                raise ValueError(f"slot {s} is not in use")
            self.lengths[s] = 0
            self._free.append(int(s))

    def length(self, slot: int) -> int:
        return self.lengths[slot]

    def reset(self, slots: Sequence[int]) -> None:
        """Empty slots still held (length 0): their next forward writes from the start."""
        for s in slots:
            if s in self._free:
                raise ValueError(f"slot {s} is not in use")
            self.lengths[s] = 0

    def copy_slots(self, sources: Sequence[int], targets: Sequence[int]) -> None:
        """Slot `targets[i]` becomes a copy of slot `sources[i]` (keys, values, length)."""
        src = torch.tensor(list(sources), dtype=torch.long, device=self.device)
        dst = torch.tensor(list(targets), dtype=torch.long, device=self.device)
        for buf in self.keys + self.values:
            buf.index_copy_(1, dst, buf.index_select(1, src))
        for s, t in zip(sources, targets):
            self.lengths[t] = self.lengths[s]

    def _grow(self, extra: int) -> None:
        old = self.num_slots
        self.keys = [torch.cat([b, self._buffer(extra)], dim=1) for b in self.keys]
        self.values = [torch.cat([b, self._buffer(extra)], dim=1) for b in self.values]
        self.lengths += [0] * extra
        self._free += list(range(old, old + extra))


class PoolForward:
    """The kv_cache hook of one forward over rows that live in pool slots `slots` (host ints):
    each layer's new keys/values are written at the slots' lengths onwards (or, when the slots
    are not distinct, appended to a gathered copy), and attention covers each row's cached
    keys plus its own real rows. `commit()` then advances the lengths by the rows' real counts."""

    def __init__(self, pool: KVSlotPool, slots: Sequence[int], valid: Sequence[int] | None = None):
        self.pool = pool
        self.slots = [int(s) for s in slots]
        # real rows of this forward per row, on the host: needed only to `commit` (the mask
        # takes the model's device lengths, so a step reads nothing from the device)
        self.valid = None if valid is None else [int(n) for n in valid]
        self.base = [pool.lengths[s] for s in self.slots]
        self.in_place = len(set(self.slots)) == len(self.slots)

    @property
    def past(self):
        """Non-None: the model runs its cached-rows path (positions after the slot's length)."""
        return self

    def layer_ports(self, num_layers: int, q: int) -> list["SlotPort"]:
        """One port per layer for this forward's `q` rows: where each layer writes its keys and
        values and what it reads back, decided here on the host once for every layer."""
        plan = self._plan(q)
        return [SlotPort(self.pool.keys[i], self.pool.values[i], plan) for i in range(num_layers)]

    def _plan(self, q: int) -> "SlotPlan":
        device = self.pool.device
        if not self.in_place:
            width = max(self.base) if self.base else 0
            shared = len(set(self.slots)) == 1  # one slot read by every row: read once and broadcast
            return SlotPlan(end=width, gather=True, broadcast=shared,
                            index=on_device(self.slots[:1] if shared else self.slots, device))
        end = max(self.base) + q
        if end > self.pool.capacity:
            raise ValueError(f"a slot would hold {end} positions; the pool's capacity is {self.pool.capacity}")
        # an index put at (position, slot) pairs and a read by slot index, even where one slice
        # would do: a slice start is a host int a compiled layer would specialise on (0, 1 and
        # any other), and a server meets every slot, so each would be a compile of its own
        return SlotPlan(end=end, write_at=self._scatter_index(q, device), index=on_device(self.slots, device))

    def _scatter_index(self, q: int, device):
        base = on_device(self.base, device)
        pos = base[None, :] + torch.arange(q, device=device)[:, None]      # [q, b]
        cols = on_device(self.slots, device)[None, :].expand(q, -1)
        return pos, cols

    def positions(self, q: int) -> torch.Tensor:
        """RoPE positions `[b, q]`: row b's token j sits at its slot's length + j."""
        base = on_device(self.base, self.pool.device)
        return base[:, None] + torch.arange(q, device=self.pool.device)[None]

    def position_limit(self, q: int) -> int:
        """One past the largest RoPE position of this forward's rows (host ints: no read)."""
        return max(self.base) + q

    def masked_keys(self, lengths: torch.Tensor, q: int) -> torch.Tensor:
        """Bool `[b, 1, 1, k]`, True = masked: each row sees its slot's cached keys and its own
        `lengths [b]` real rows, whichever layout `update` returns (the one split rule: these
        rows are all past the cached prefix, so they see every real key)."""
        dev = lengths.device
        base = on_device(self.base, dev)
        if self.in_place:
            keys = torch.arange(max(self.base) + q, device=dev)[None]
            return ~(keys < (base + lengths)[:, None])[:, None, None, :]
        width = max(self.base) if self.base else 0
        keys = torch.arange(width + q, device=dev)[None]
        fresh = (keys >= width) & (keys < width + lengths[:, None])
        return ~((keys < base[:, None]) | fresh)[:, None, None, :]

    def commit(self) -> None:
        """Advance each slot by this forward's real rows: its keys join the cached prefix.
        Only an in-place forward can be committed (its keys are in the slots)."""
        if not self.in_place or self.valid is None:
            raise ValueError("only a forward over distinct slots, told its rows' real counts, can be committed")
        for s, b, n in zip(self.slots, self.base, self.valid):
            self.pool.lengths[s] = b + n


class FixedShapePoolForward(PoolForward):
    """The kv_cache hook of a forward whose tensor shapes depend only on (rows, width): what a
    CUDA graph can capture once per shape and replay at every iteration of every block.

    The rows are slots `first .. first + rows - 1` (a view of the buffers); their lengths come
    as a device tensor `base [rows]` (a graph's static input, refilled before each replay)
    instead of host ints. Each layer writes its keys/values at `base + j` with an index put,
    and attention covers each slot's first `keys` positions (a fixed bound the caller rounds
    up, so one graph serves many blocks; default the capacity) under a key-padding mask
    `position < base + lengths`: the same visible set as `PoolForward`, so the same logits up
    to rounding (the zero-filled or stale keys past a slot's length are masked). The caller
    keeps `base + q <= keys <= capacity` (checked on the host, where the lengths live); such a
    forward is never committed (a block's extension runs `PoolForward`)."""

    def __init__(self, pool: KVSlotPool, first: int, rows: int, base: torch.Tensor, keys: int | None = None):
        super().__init__(pool, list(range(first, first + rows)))
        self.first, self.rows, self.base_t = first, rows, base
        self.keys_bound = pool.capacity if keys is None else int(keys)

    def layer_ports(self, num_layers: int, q: int) -> list["SlotPort"]:
        kbuf = self.pool.keys[0]
        pos = self.base_t[None, :] + torch.arange(q, device=kbuf.device)[:, None]          # [q, b]
        cols = torch.arange(self.first, self.first + self.rows, device=kbuf.device)[None, :].expand(q, -1)
        plan = SlotPlan(end=self.keys_bound, write_at=(pos, cols), view=(self.first, self.rows))
        return [SlotPort(self.pool.keys[i], self.pool.values[i], plan) for i in range(num_layers)]

    def positions(self, q: int) -> torch.Tensor:
        return self.base_t[:, None] + torch.arange(q, device=self.base_t.device)[None]

    def position_limit(self, q: int) -> int:
        return self.keys_bound

    def masked_keys(self, lengths: torch.Tensor, q: int) -> torch.Tensor:
        keys = torch.arange(self.keys_bound, device=lengths.device)[None]
        return ~(keys < (self.base_t.to(lengths.device) + lengths)[:, None])[:, None, None, :]

    def commit(self) -> None:
        raise ValueError("a fixed-shape forward is never committed; extend a block with PoolForward")


class SlotPlan:
    """How every layer of one pool forward writes and reads its buffers, fixed on the host
    before the layers run: tensors and host ints only, so a compiled layer traces one code path
    and guards on nothing that changes per call but shapes and sizes.

    - `gather`: the rows' slots are not distinct; read each row's first `end` cached positions
      from the slots `index` (one slot broadcast to every row when `broadcast`) and append the
      new keys.
    - otherwise write the new keys at the `write_at` (positions, slots) index pairs, then read the
      first `end` positions of the slots `index`, or, given `view=(first, rows)` instead, of
      slots `first .. first + rows - 1` as a view (the fixed-shape forward: one graph per first
      slot anyway).
    """

    def __init__(self, *, end: int, gather: bool = False, broadcast: bool = False,
                 index: torch.Tensor | None = None, view: tuple[int, int] | None = None,
                 write_at: tuple[torch.Tensor, torch.Tensor] | None = None):
        if (index is None) == (view is None):
            raise ValueError("a slot plan reads its slots either by `index` or as a `view`, one of the two")
        self.end, self.gather, self.broadcast = end, gather, broadcast
        self.index, self.view, self.write_at = index, view, write_at

    def apply(self, buf: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """Write `new [q, b, ng, d]` into `buf` as planned; the keys (or values) to attend to."""
        if self.gather:
            cached = buf[:self.end].index_select(1, self.index)
            if self.broadcast:
                cached = cached.expand(-1, new.shape[1], -1, -1)
            return torch.cat([cached, new], dim=0)
        buf.index_put_(self.write_at, new)
        if self.view is not None:
            first, rows = self.view
            return buf[:self.end, first:first + rows]
        return buf[:self.end].index_select(1, self.index)


class SlotPort:
    """One layer's key and value buffers of the pool and the forward's `SlotPlan` (`LayerKV`)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, plan: SlotPlan):
        self.keys, self.values, self.plan = keys, values, plan

    def update(self, key: torch.Tensor, value: torch.Tensor):
        return self.plan.apply(self.keys, key), self.plan.apply(self.values, value)


def on_device(values: Sequence[int], device) -> torch.Tensor:
    """Host ints (slots, lengths, row indices) as a long tensor on `device`, copied without
    making the host wait: a cached step, and the block of iterations around it, read nothing
    back from the device and wait for nothing."""
    return torch.tensor(list(values), dtype=torch.long).to(device, non_blocking=True)
