"""The split rule as two flash-attn varlen calls: which rows and lengths each call takes.

Under :func:`~megatron_biglm.objective.split_rule.visible`, prefix rows (q < split) see exactly
the prefix keys and suffix rows every real key, so two non-causal ``flash_attn_varlen_func``
calls realise the rule exactly: prefix queries vs prefix keys, suffix queries vs all real keys
of the sample. Only
``[b, s]`` index tensors are built, never an s x s mask. ``varlen_attention`` runs the calls.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from megatron_biglm.objective.split_rule import CheckedSplit, checked_split


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


    def to(self, device) -> "VarlenSplit":
        """The same description with its tensors on ``device`` (asynchronous copies)."""
        moved = {name: getattr(self, name).to(device, non_blocking=True) for name in _TENSOR_FIELDS}
        return dataclasses.replace(self, **moved)


_TENSOR_FIELDS = ("prefix_cu_seqlens", "suffix_cu_seqlens_q", "suffix_cu_seqlens_k", "prefix_index",
                  "suffix_index", "kv_index")


def _cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    zero = torch.zeros(1, dtype=torch.int32)
    return torch.cat([zero, torch.cumsum(lengths, 0).to(torch.int32)])


def varlen_split_lengths(
    split, seq_len: int, *, valid_lengths: torch.Tensor | None = None
) -> VarlenSplit:
    """The :class:`VarlenSplit` description for a batch of splits (a raw split or a
    :class:`CheckedSplit`), its tensors on the split's device.

    Built on the host from the lengths (the maximum lengths, the offsets and the row indices
    are host arithmetic), then moved: from the loader's CPU tensors nothing is read back from
    the device.
    """
    if isinstance(split, CheckedSplit):
        device = split.device
        split, valid = checked_split(split.to("cpu"), seq_len)
    else:
        split = torch.as_tensor(split)
        device = split.device
        split, valid = checked_split(split.cpu(), seq_len,
                                     None if valid_lengths is None else torch.as_tensor(valid_lengths).cpu())
    b = split.shape[0]
    pos = torch.arange(seq_len).view(1, seq_len)
    rows = torch.arange(b * seq_len).view(b, seq_len)
    is_prefix = pos < split.view(-1, 1)
    is_valid = pos < valid.view(-1, 1)
    suffix_len = valid - split
    described = VarlenSplit(
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
    return described if device.type == "cpu" else described.to(device)
