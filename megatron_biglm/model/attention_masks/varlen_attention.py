"""Split attention as two variable-length (flash-attn style) calls, plus a CPU emulation.

:func:`split_varlen_attention` runs the two calls a :class:`VarlenSplit` describes with any
function that has ``flash_attn_varlen_func``'s leading signature, so the GPU path passes
flash-attn's kernel and CPU tests pass :func:`sdpa_varlen_attention`, an exact emulation by
per-segment SDPA. Keeping the orchestration here means the gather/scatter logic that tests
verify is the same code the GPU path runs.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .varlen import VarlenSplit


def sdpa_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """CPU reference for ``flash_attn_varlen_func`` (non-causal): packed ``[total, heads, dim]``.

    Each segment i attends q[cu_q[i]:cu_q[i+1]] to k/v[cu_k[i]:cu_k[i+1]]. GQA (fewer k/v
    heads) is supported as in flash-attn. Slow (a Python loop over segments): tests only.
    """
    if causal:
        raise NotImplementedError("the split objective only needs non-causal varlen attention")
    out = q.new_zeros(q.shape[0], q.shape[1], v.shape[-1])
    gqa = k.shape[1] != q.shape[1]
    for i in range(cu_seqlens_q.numel() - 1):
        q0, q1 = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1])
        k0, k1 = int(cu_seqlens_k[i]), int(cu_seqlens_k[i + 1])
        if q1 == q0:
            continue
        if k1 == k0:
            raise ValueError(f"segment {i} has {q1 - q0} queries but no keys")
        seg = F.scaled_dot_product_attention(
            q[q0:q1].transpose(0, 1),
            k[k0:k1].transpose(0, 1),
            v[k0:k1].transpose(0, 1),
            scale=softmax_scale,
            enable_gqa=gqa,
        )
        out[q0:q1] = seg.transpose(0, 1)
    return out


VarlenFn = Callable[..., torch.Tensor]


def split_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    varlen: VarlenSplit,
    varlen_fn: VarlenFn = sdpa_varlen_attention,
    softmax_scale: float | None = None,
) -> torch.Tensor:
    """Split-restricted attention for ``q, k, v`` in ``[b, s, heads, dim]`` (flash layout).

    Returns ``[b, s, heads, dim_v]``; padded rows (outside both indices) are zero.
    """
    b, s = q.shape[:2]
    if (b, s) != (varlen.batch_size, varlen.seq_len):
        raise ValueError(
            f"q has batch/seq {(b, s)} but the VarlenSplit was built for "
            f"{(varlen.batch_size, varlen.seq_len)}"
        )
    qp, kp, vp = (t.reshape(b * s, *t.shape[2:]) for t in (q, k, v))
    out = qp.new_zeros(b * s, q.shape[2], v.shape[-1])
    if varlen.prefix_index.numel():
        pre = varlen.prefix_index
        out[pre] = varlen_fn(
            qp[pre], kp[pre], vp[pre],
            varlen.prefix_cu_seqlens, varlen.prefix_cu_seqlens,
            varlen.prefix_max_seqlen, varlen.prefix_max_seqlen,
            softmax_scale=softmax_scale, causal=False,
        )
    if varlen.suffix_index.numel():
        suf, kv = varlen.suffix_index, varlen.kv_index
        out[suf] = varlen_fn(
            qp[suf], kp[kv], vp[kv],
            varlen.suffix_cu_seqlens_q, varlen.suffix_cu_seqlens_k,
            varlen.suffix_max_seqlen_q, varlen.suffix_max_seqlen_k,
            softmax_scale=softmax_scale, causal=False,
        )
    return out.view(b, s, q.shape[2], v.shape[-1])
