"""The split rule as dense bool masks: for the sdpa/local backends, CPU references and HF inputs.

Two conventions exist and both are named for what True means: megatron-core's arbitrary mask
(True = masked out: :func:`dense_split_mask`) and SDPA's ``attn_mask`` (True = attend:
:func:`dense_visible_mask`, and the ``[b, q, k]`` masks below). These are s x s tensors: only
the sdpa/local backends and small (evaluation, test) batches use them, never flex or flash.
"""
from __future__ import annotations

import torch

from megatron_biglm.objective.split_rule import checked_split, visible


def _grid(split, seq_len, valid_lengths):
    split, valid = checked_split(split, seq_len, valid_lengths)
    pos = torch.arange(seq_len, device=split.device)
    return visible(pos.view(1, seq_len, 1), pos.view(1, 1, seq_len), split.view(-1, 1, 1),
                   valid.view(-1, 1, 1))


def dense_visible_mask(split: torch.Tensor, seq_len: int, *,
                       valid_lengths: torch.Tensor | None = None) -> torch.Tensor:
    """``[b, 1, s, s]`` bool, True = the query may attend to the key (SDPA's convention)."""
    return _grid(split, seq_len, valid_lengths).unsqueeze(1)


def dense_split_mask(split: torch.Tensor, seq_len: int, *,
                     valid_lengths: torch.Tensor | None = None) -> torch.Tensor:
    """``[b, 1, s, s]`` bool, True = masked out (megatron-core's ``AttnMaskType.arbitrary``).

    ``torch.nn.functional.scaled_dot_product_attention`` takes the opposite convention: pass
    ``~mask`` there (or use :func:`dense_visible_mask`). Padded query rows still see the real
    keys of their row, so no row is fully masked (softmax would be NaN); loss-mask them.
    """
    return (~_grid(split, seq_len, valid_lengths)).unsqueeze(1)


def sequence_mask(lengths: torch.Tensor, seq_len: int, split: torch.Tensor | None) -> torch.Tensor:
    """Bool ``[b, s, s]``, True = may attend, for right-padded rows of ``lengths``.

    ``split`` None is full attention among the real tokens (the rule with split 0). Not
    range-checked (evaluation builds splits within the lengths itself).
    """
    pos = torch.arange(seq_len, device=lengths.device)
    split = torch.zeros_like(lengths) if split is None else split
    return visible(pos.view(1, seq_len, 1), pos.view(1, 1, seq_len), split[:, None, None],
                   lengths[:, None, None])


def block_causal_mask(lengths: torch.Tensor, seq_len: int, starts: torch.Tensor) -> torch.Tensor:
    """Bool ``[b, s, s]``, True = may attend: the split rule applied at every block start.

    ``starts [b, m]`` are the first positions of blocks 1..m of each row (block 0 is the
    prompt); a row with fewer blocks repeats a start. A query sees a key iff, at every start,
    the rule allows it: ``q >= start or k < start``. That is "the key's block is not after the
    query's", so finished blocks never see later ones, and one start is the plain split. The
    cached generation path (prefix K/V extended block by block) computes exactly this pattern;
    this mask is its uncached reference. Built from each position's block index (O(s·m + s²),
    not m applications of the rule).
    """
    pos = torch.arange(seq_len, device=lengths.device)
    block = (starts[:, None, :] <= pos[None, :, None]).sum(dim=-1)  # [b, s]: blocks started at or before
    allowed = block[:, None, :] <= block[:, :, None]
    return allowed & (pos[None, None, :] < lengths[:, None, None])


def suffix_after_prefix_mask(prefix_lengths: torch.Tensor, prefix_width: int,
                             suffix_lengths: torch.Tensor, suffix_width: int) -> torch.Tensor:
    """Bool ``[b, q, p + q]``, True = may attend: suffix queries over a cached prefix.

    The keys are laid out ``[prefix (padded to p), suffix (padded to q)]``; the split is the
    prefix length, so the queries (all suffix rows) see every real key.
    """
    device = prefix_lengths.device
    p_idx = torch.arange(prefix_width, device=device)[None, :]
    s_idx = torch.arange(suffix_width, device=device)[None, :]
    key_real = torch.cat([p_idx < prefix_lengths[:, None], s_idx < suffix_lengths[:, None]], dim=1)
    key_pos = torch.cat([p_idx.expand(prefix_lengths.shape[0], -1), prefix_lengths[:, None] + s_idx],
                        dim=1)
    query_pos = prefix_lengths[:, None] + s_idx
    return visible(query_pos[:, :, None], key_pos[:, None, :], prefix_lengths[:, None, None],
                   key_real=key_real[:, None, :])
