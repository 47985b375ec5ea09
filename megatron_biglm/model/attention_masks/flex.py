"""The split rule as a FlexAttention ``BlockMask``: per-block lists, no s x s tensor.

The ``mask_mod`` is :func:`~megatron_biglm.objective.split_rule.visible` itself; the block
lists (which key blocks each query block must visit, and which of those are full so the kernel
skips ``mask_mod`` there) come from integer arithmetic on ``split`` and the valid lengths, so
building costs ``b * (s / block)^2`` integers and no compile. tests/objective/test_split_rule.py checks
the lists against the rule, and tests/objective/test_split_mask.py against torch's ``create_block_mask``.
"""
from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from megatron_biglm.objective.split_rule import checked_split, visible

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
    split, valid = checked_split(split, seq_len, valid_lengths)
    device = torch.device(device) if device is not None else split.device
    split_d = split.to(device)
    valid_d = valid.to(device)

    def split_mask_mod(b, h, q_idx, kv_idx):
        return visible(q_idx, kv_idx, split_d[b], valid_d[b])

    if method == "analytic":
        return _analytic_split_block_mask(split_d, valid_d, seq_len, q_bs, kv_bs, split_mask_mod)

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
