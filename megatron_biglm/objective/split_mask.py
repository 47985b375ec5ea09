"""BiGLM's prefix/suffix attention restriction, in each representation an attention kernel needs.

A sample of length ``s`` is cut at ``split`` into a prefix X = [0, split) and a suffix
Y = [split, s). Prefix queries must not see the suffix (at inference there is no target yet);
suffix queries see everything:

    allowed(q, k) = (q >= split) or (k < split)

One function per target representation, all derived from that single rule:

* :func:`dense_split_mask`: ``[b, 1, s, s]`` bool, **True = masked out** (megatron-core's
  ``AttnMaskType.arbitrary`` convention; the CPU reference path and tests).
* :func:`flex_split_block_mask`: a FlexAttention ``BlockMask``, built analytically from
  per-block counts (no dense mask, no compile).
* :func:`varlen_split_lengths`: the two ``flash_attn_varlen_func`` calls that realise the rule
  exactly (prefix q vs prefix kv, suffix q vs all kv); see :class:`VarlenSplit`.

Variants without the restriction (``mlm``, ``no_attn``) have no mask at all: use
:func:`split_for_variant`, which returns ``None`` for them, and build a mask only when the split
is not ``None``.

``valid_lengths`` (optional, ``[b]``) describes right padding: keys at ``k >= valid_lengths[b]``
are masked out for every query. Padded query rows still see the prefix (so no row is fully
masked, which would make softmax NaN); their outputs are meaningless and must be loss-masked.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

#: Variants of the objective (see ``ObjectiveConfig.variant``).
VARIANTS = ("biglm", "no_attn", "mlm")
#: Variants whose attention is full/bidirectional: they need no mask.
UNMASKED_VARIANTS = ("no_attn", "mlm")


def split_for_variant(split: torch.Tensor | None, variant: str) -> torch.Tensor | None:
    """The split to build an attention mask from, or ``None`` when ``variant`` uses full attention.

    ``no_attn`` ("w/o attn", Table 1) keeps the prefix/suffix masking but drops the attention
    restriction; ``mlm`` ("w/o both") has no split. Callers do
    ``mask = build(split, s) if (split := split_for_variant(split, v)) is not None else None``.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown objective variant {variant!r}; expected one of {VARIANTS}")
    if variant in UNMASKED_VARIANTS:
        return None
    return split


def _check_split(split: torch.Tensor, seq_len: int, valid_lengths: torch.Tensor | None):
    """Validate shapes/ranges once, so every representation fails the same clear way."""
    split = torch.as_tensor(split)
    if split.dim() != 1:
        raise ValueError(f"split must be a 1-D tensor [batch], got shape {tuple(split.shape)}")
    if split.dtype.is_floating_point or split.dtype == torch.bool:
        raise TypeError(f"split must hold integer prefix lengths, got dtype {split.dtype}")
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    split = split.to(torch.int64)
    if valid_lengths is None:
        valid = torch.full_like(split, seq_len)
    else:
        valid = torch.as_tensor(valid_lengths, device=split.device).to(torch.int64)
        if valid.shape != split.shape:
            raise ValueError(
                f"valid_lengths shape {tuple(valid.shape)} must match split {tuple(split.shape)}"
            )
        if bool(((valid < 1) | (valid > seq_len)).any()):
            raise ValueError(f"valid_lengths must lie in [1, seq_len={seq_len}], got {valid.tolist()}")
    if bool(((split < 0) | (split > valid)).any()):
        raise ValueError(
            f"split must lie in [0, valid length] (seq_len={seq_len}), got {split.tolist()}; "
            "a split is a prefix length, not a position past the sequence"
        )
    return split, valid


def dense_split_mask(
    split: torch.Tensor, seq_len: int, *, valid_lengths: torch.Tensor | None = None
) -> torch.Tensor:
    """``[b, 1, s, s]`` bool mask, True = masked out (megatron-core's convention).

    Note ``torch.nn.functional.scaled_dot_product_attention`` takes the opposite convention
    (True = attend): pass ``~mask`` there.
    """
    split, valid = _check_split(split, seq_len, valid_lengths)
    pos = torch.arange(seq_len, device=split.device)
    q = pos.view(1, seq_len, 1)
    k = pos.view(1, 1, seq_len)
    s = split.view(-1, 1, 1)
    allowed = ((q >= s) | (k < s)) & (k < valid.view(-1, 1, 1))
    return (~allowed).unsqueeze(1)


#: How :func:`flex_split_block_mask` builds the BlockMask.
FLEX_BUILD_METHODS = ("analytic", "create")


def _block_sizes(block_size) -> tuple[int, int]:
    q_bs, kv_bs = (block_size, block_size) if isinstance(block_size, int) else tuple(block_size)
    if q_bs <= 0 or kv_bs <= 0:
        raise ValueError(f"block_size must be positive, got {block_size!r}")
    return int(q_bs), int(kv_bs)


def _ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(num_blocks, indices)`` of a ``[..., rows, cols]`` 0/1 block grid, in torch's layout.

    Same as torch's ``_dense_to_ordered``: per row, the kept column blocks ascending, then the
    others ascending (stable argsort); kernels read only the first ``num_blocks``. Matching it
    makes our BlockMask equal ``create_block_mask``'s bit for bit.
    """
    blocks = blocks.to(torch.int32)
    indices = torch.argsort(blocks, dim=-1, descending=True, stable=True)
    return blocks.sum(dim=-1, dtype=torch.int32).contiguous(), indices.to(torch.int32).contiguous()


def _analytic_split_block_mask(split, valid, seq_len, q_bs, kv_bs, mask_mod):
    """The split rule's BlockMask from per-block integer arithmetic: O(b * nq * nk), no s x s.

    For query block rows ``[q0, q_last]`` of a sample with split ``s`` and valid length ``n``
    (``s <= n``): prefix rows see keys ``[0, s)``, suffix rows ``[0, n)``. So a key block is
    kept iff it starts below the union limit (``n`` if the block has a suffix row, else ``s``)
    and is FULL iff it ends at or below the intersection limit (``s`` if the block has a prefix
    row, else ``n``). Like ``create_block_mask`` (which pads its grid with False), a block that
    overhangs ``seq_len`` in q or kv is never full; kept-but-not-full blocks are partial.

    The q-major lists (backward) come from the same small grid, transposed: torch's
    ``from_kv_blocks`` rebuilds that grid with a scatter that alone costs ~20 ms at s = 8192.
    """
    from torch.nn.attention.flex_attention import BlockMask

    device = split.device
    nq, nk = -(-seq_len // q_bs), -(-seq_len // kv_bs)
    split, valid = split.view(-1, 1, 1, 1), valid.view(-1, 1, 1, 1)  # [b, H=1, nq, nk]
    q0 = torch.arange(nq, device=device).view(1, 1, nq, 1) * q_bs
    k0 = torch.arange(nk, device=device).view(1, 1, 1, nk) * kv_bs
    q_last = torch.clamp(q0 + q_bs, max=seq_len) - 1  # last real query row of the block
    union_limit = torch.where(q_last >= split, valid, split)
    inter_limit = torch.where(q0 < split, split, valid)
    kept = k0 < union_limit
    full = (k0 + kv_bs <= inter_limit) & (q0 + q_bs <= seq_len)  # inter_limit <= seq_len
    partial = kept & ~full
    kv_num, kv_idx = _ordered(partial)
    full_kv_num, full_kv_idx = _ordered(full)
    q_num, q_idx = _ordered(partial.transpose(-2, -1))
    full_q_num, full_q_idx = _ordered(full.transpose(-2, -1))
    return BlockMask(
        seq_lengths=(seq_len, seq_len),
        kv_num_blocks=kv_num, kv_indices=kv_idx,
        full_kv_num_blocks=full_kv_num, full_kv_indices=full_kv_idx,
        q_num_blocks=q_num, q_indices=q_idx,
        full_q_num_blocks=full_q_num, full_q_indices=full_q_idx,
        BLOCK_SIZE=(q_bs, kv_bs), mask_mod=mask_mod,
    )


def flex_split_block_mask(
    split: torch.Tensor,
    seq_len: int,
    *,
    block_size: int | tuple[int, int] = 128,
    device: torch.device | str | None = None,
    valid_lengths: torch.Tensor | None = None,
    method: str = "analytic",
    compile: bool = False,
):
    """A FlexAttention ``BlockMask`` for the split rule (heads broadcast, ``H=None``).

    ``mask_mod`` closes over ``split`` (moved to ``device``), so one BlockMask serves all layers
    of a step. Blocks fully inside the allowed region are marked full and skip mask_mod.

    ``method="analytic"`` (default) computes the block lists from the split arithmetic: a few
    tensors of size ``b * (s / block)^2``, no compile, identical to ``create_block_mask``'s.
    ``method="create"`` calls torch's ``create_block_mask`` (kept to cross-check): eager it
    evaluates mask_mod on the dense b x s x s grid (1.3 GB at s = 8192, b = 2); ``compile=True``
    avoids that at ~30 s of compilation per process.
    """
    if method not in FLEX_BUILD_METHODS:
        raise ValueError(f"unknown BlockMask build method {method!r}; expected one of {FLEX_BUILD_METHODS}")
    if compile and method != "create":
        raise ValueError("compile=True applies to method='create' only; the analytic build needs no compile")
    q_bs, kv_bs = _block_sizes(block_size)
    split, valid = _check_split(split, seq_len, valid_lengths)
    device = torch.device(device) if device is not None else split.device
    split_d = split.to(device)
    valid_d = valid.to(device)

    def split_mask_mod(b, h, q_idx, kv_idx):
        sb = split_d[b]
        return ((q_idx >= sb) | (kv_idx < sb)) & (kv_idx < valid_d[b])

    if method == "analytic":
        return _analytic_split_block_mask(split_d, valid_d, seq_len, q_bs, kv_bs, split_mask_mod)
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(
        split_mask_mod,
        B=split.shape[0],
        H=None,
        Q_LEN=seq_len,
        KV_LEN=seq_len,
        device=device,
        BLOCK_SIZE=(q_bs, kv_bs),
        _compile=compile,
    )


@dataclass(frozen=True)
class VarlenSplit:
    """What two ``flash_attn_varlen_func`` calls need to realise the split rule exactly.

    Rows of q/k/v are packed as ``[b*s, heads, dim]`` (row ``i*s + t`` = sample i, position t).

    Call 1, prefix queries vs prefix keys::

        o_pre = flash_attn_varlen_func(q[prefix_index], k[prefix_index], v[prefix_index],
                    prefix_cu_seqlens, prefix_cu_seqlens, prefix_max_seqlen, prefix_max_seqlen)

    Call 2, suffix queries vs every (valid) key of their sample::

        o_suf = flash_attn_varlen_func(q[suffix_index], k[kv_index], v[kv_index],
                    suffix_cu_seqlens_q, suffix_cu_seqlens_k, suffix_max_seqlen_q, suffix_max_seqlen_k)

    then ``out[prefix_index] = o_pre; out[suffix_index] = o_suf`` (padded rows, if any, are in
    neither index: leave them zero and loss-mask them). Both calls are non-causal. Samples with
    an empty prefix (split 0) or empty suffix contribute zero-length sequences, which
    flash-attn accepts. ``kv_index`` is ``arange(b*s)`` when there is no padding.
    """

    batch_size: int
    seq_len: int
    prefix_cu_seqlens: torch.Tensor  # int32 [b+1], cumsum of split
    prefix_max_seqlen: int
    suffix_cu_seqlens_q: torch.Tensor  # int32 [b+1], cumsum of valid - split
    suffix_cu_seqlens_k: torch.Tensor  # int32 [b+1], cumsum of valid (= seq_len unpadded)
    suffix_max_seqlen_q: int
    suffix_max_seqlen_k: int
    prefix_index: torch.Tensor  # int64 [sum split], rows of the packed [b*s] layout
    suffix_index: torch.Tensor  # int64 [sum(valid - split)]
    kv_index: torch.Tensor  # int64 [sum valid]


def _cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    zero = torch.zeros(1, dtype=torch.int32, device=lengths.device)
    return torch.cat([zero, torch.cumsum(lengths, 0).to(torch.int32)])


def varlen_split_lengths(
    split: torch.Tensor, seq_len: int, *, valid_lengths: torch.Tensor | None = None
) -> VarlenSplit:
    """The :class:`VarlenSplit` description for a batch of splits (all tensors on split's device)."""
    split, valid = _check_split(split, seq_len, valid_lengths)
    b = split.shape[0]
    pos = torch.arange(seq_len, device=split.device).view(1, seq_len)
    rows = torch.arange(b * seq_len, device=split.device).view(b, seq_len)
    is_prefix = pos < split.view(-1, 1)
    is_valid = pos < valid.view(-1, 1)
    suffix_len = valid - split
    return VarlenSplit(
        batch_size=b,
        seq_len=seq_len,
        prefix_cu_seqlens=_cu_seqlens(split),
        prefix_max_seqlen=int(split.max()) if b else 0,
        suffix_cu_seqlens_q=_cu_seqlens(suffix_len),
        suffix_cu_seqlens_k=_cu_seqlens(valid),
        suffix_max_seqlen_q=int(suffix_len.max()) if b else 0,
        suffix_max_seqlen_k=int(valid.max()) if b else 0,
        prefix_index=rows[is_prefix],
        suffix_index=rows[~is_prefix & is_valid],
        kv_index=rows[is_valid],
    )
