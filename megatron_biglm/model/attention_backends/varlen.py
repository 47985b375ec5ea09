"""`varlen`: one call of torch's varlen attention (torch.nn.attention.varlen, CUDA, fp16/bf16)
over [prefix, suffix] segments, the prefix keys gathered twice; only the visible pairs are
computed. Segments from the host lengths."""
from __future__ import annotations

import functools
import inspect

import torch

from megatron_biglm.model.attention_masks import VarlenSegments, varlen_segments, varlen_split_attention

from .protocol import HALF_DTYPES, DeriveOptions

TORCH_VARLEN_MISSING = (
    "attention_backend 'varlen' needs torch.nn.attention.varlen (torch >= 2.10) and a CUDA device; "
    "use 'sdpa_split', 'flex' or 'sdpa' without them"
)


@functools.lru_cache(maxsize=1)
def torch_varlen_available() -> bool:
    """CUDA and torch's own varlen attention (`torch.nn.attention.varlen.varlen_attn`)."""
    if not torch.cuda.is_available():
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn  # lazy: optional (newer torch only); noqa: F401
    except ImportError:
        return False
    return True


def torch_varlen_fn(q, k, v, cu_q, cu_k, max_q: int, max_k: int, softmax_scale=None, causal=False):
    """torch's varlen attention behind flash-attn's `flash_attn_varlen_func` signature. GQA is
    passed through where this torch's `varlen_attn` takes `enable_gqa`, else K/V heads are
    repeated."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # lazy: optional (newer torch only)
    except ImportError as exc:
        raise ImportError(TORCH_VARLEN_MISSING) from exc
    if causal:
        raise NotImplementedError("the split objective only needs non-causal varlen attention")
    extra = {}
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in inspect.signature(varlen_attn).parameters:
            extra["enable_gqa"] = True
        else:
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, scale=softmax_scale, **extra)


class VarlenBackend:
    name = "varlen"
    dtypes = HALF_DTYPES
    supports_dropout = False
    megatron_native = False

    def unavailable(self, *, training: bool = True) -> str | None:  # noqa: ARG002 - the Protocol's signature
        return None if torch_varlen_available() else TORCH_VARLEN_MISSING

    def derive(self, split, options: DeriveOptions) -> VarlenSegments:
        segments = varlen_segments(split, split.seq_len)
        return segments.to(options.device) if options.device is not None else segments

    def forward(self, core, query, key, value, derived: VarlenSegments) -> torch.Tensor:
        if core.attention_dropout_p() > 0:
            raise NotImplementedError("torch's varlen attention has no attention dropout; use attention_backend "
                                      "sdpa_split or sdpa with attention_dropout > 0")
        q, k, v = (t.transpose(0, 1) for t in (query, key, value))  # [b, s, h, d]
        out = varlen_split_attention(q, k, v, derived, torch_varlen_fn, softmax_scale=core.softmax_scale)
        return out.transpose(0, 1)

    def describe(self, dtype, options) -> str:  # noqa: ARG002
        return f"torch varlen attention (torch.nn.attention.varlen), one call over prefix/suffix segments ({dtype})"
