"""megatron-core's unfused RoPE (`rope_utils._apply_rotary_pos_emb_bshd`, reached from
`megatron.core.transformer.attention` through its module global `apply_rotary_pos_emb`; seen in
0.16.1 and 0.19.2) spends, per call on q or k: a slice of t into (t, t_pass) and a
`torch.cat((t, t_pass))` that copies all of t even when t_pass is empty; `_rotate_half`'s chunk,
negation and cat (two more copies of t); two products and a sum. Its autograd backward adds the
cats' and chunk's backward copies and the slices' zero-filled gradients. At BiGLM's 136M shape on
one CPU thread that is about 1.4 % of a training step. `apply()` points the attention module's
global at a dispatcher that computes the plain case in one autograd Function (one product, two
half-width fused multiply-adds, forward and backward alike) and hands every other case to
megatron's function unchanged.

The plain case is the one BiGLM runs: sbhd layout (no `cu_seqlens`), no fused RoPE, no
interleaved or multi-latent rotation, rotary over all of the head dim (freqs' last dim == t's,
even), freqs that need no gradient and broadcast to t's shape. Context parallelism needs no
check: for sbhd, megatron slices freqs per rank before this call and this call does nothing
rank-specific. The result is megatron's formula, out = t*cos + rotate_half(t)*sin with cos and
sin taken as `(cos(freqs) * mscale).to(t.dtype)` as megatron takes them. It rounds each product
and sum at most as often as megatron does, so the two differ by at most a few roundings:
|ours - megatron| <= 2*eps(dtype)*(|t*cos| + |rotate_half(t)*sin|) elementwise, for fp32 and bf16
alike (the tests check this bound, and the same for the input gradient).

Per-call host work is kept off the step: the plain-case check compares shapes in Python (not
`torch.broadcast_shapes`, which runs torch's reference shape logic on every call), and the
cos/sine tables are built once per angle tensor: megatron computes one `freqs` per forward
(its rotary embedding caches it per length) and hands it to q and k of every layer, so the
last table is reused while the same, unmodified `freqs` comes back at the same dtype and
mscale. Reusing it computes nothing differently.
"""
from __future__ import annotations

from typing import Any

import torch

from ._patching import Patch, import_or_none, replace_attr

TARGET = "megatron.core.transformer.attention"
ATTR = "apply_rotary_pos_emb"
NAME = "rope_one_pass"


def _rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """t*cos + swap_halves(t)*sin, into a fresh contiguous tensor of t's shape.

    `sin` is the signed sine: its first half carries the minus sign `_rotate_half` puts on t's
    second half."""
    half = t.shape[-1] // 2
    out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    torch.mul(t, cos, out=out)
    out[..., :half].addcmul_(t[..., half:], sin[..., :half])
    out[..., half:].addcmul_(t[..., :half], sin[..., half:])
    return out


class OnePassRope(torch.autograd.Function):
    """RoPE on the last dim with a precomputed cos and signed sine, in one pass each way.

    out = t*c + P(t)*s, with P the swap of the two halves, so dL/dt = g*c + P(g*s)
    = g*c + P(g)*P(s): the same rotation with P(s) for the sine. Backward therefore calls this
    Function again, which keeps higher-order gradients working."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                sin_swapped: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin, sin_swapped)
        return _rotate(t, cos, sin)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        cos, sin, sin_swapped = ctx.saved_tensors
        return OnePassRope.apply(grad, cos, sin_swapped, sin), None, None, None


def _tables(freqs: torch.Tensor, mscale: float, dtype: torch.dtype):
    """(cos, signed sine, swapped signed sine) of `freqs` at `dtype`, as megatron takes them."""
    cos = torch.cos(freqs)
    sin = torch.sin(freqs)
    if mscale != 1.0:
        cos = cos * mscale
        sin = sin * mscale
    cos = cos.to(dtype)
    sin = sin.to(dtype)
    sin_first, sin_second = sin.chunk(2, dim=-1)
    signed = torch.cat((-sin_first, sin_second), dim=-1)
    swapped = torch.cat((sin_second, -sin_first), dim=-1)
    return cos, signed, swapped


class _LastTables:
    """The tables of the last angle tensor seen: reused while the same tensor (same object, same
    in-place version) comes back at the same dtype and mscale. Under inference mode (its tensors
    carry no version and cannot be saved for a later backward) and inside a compiled graph (which
    traces the tables itself) they are computed afresh. One entry, swapped whole (thread-safe)."""

    def __init__(self):
        self.last = None  # (freqs, version, mscale, dtype, tables)

    def get(self, freqs: torch.Tensor, mscale: float, dtype: torch.dtype):
        # is_compiling first: dynamo cannot trace the inference-mode queries
        if torch.compiler.is_compiling() or torch.is_inference_mode_enabled() or freqs.is_inference():
            return _tables(freqs, mscale, dtype)
        last, version = self.last, freqs._version
        if last is not None and last[0] is freqs and last[1] == version and last[2] == mscale and last[3] == dtype:
            return last[4]
        tables = _tables(freqs, mscale, dtype)
        self.last = (freqs, version, mscale, dtype, tables)
        return tables


_LAST = _LastTables()


def one_pass_rope(t: torch.Tensor, freqs: torch.Tensor, mscale: float = 1.0) -> torch.Tensor:
    """Megatron's unfused non-interleaved RoPE over all of t's last dim, in one pass.

    freqs: angles [s, ..., d] with d == t.shape[-1], broadcastable to t (megatron's layout:
    both halves of the last dim hold the same angles for standard RoPE)."""
    cos, signed, swapped = _LAST.get(freqs, mscale, t.dtype)
    return OnePassRope.apply(t, cos, signed, swapped)


def _broadcasts_to(shape, target) -> bool:
    """Whether `shape` broadcasts to exactly `target` (torch's rule, on plain tuples)."""
    if len(shape) > len(target):
        return False
    return all(a == b or a == 1 for a, b in zip(reversed(tuple(shape)), reversed(tuple(target))))


def is_plain(t: torch.Tensor, freqs: torch.Tensor, config: Any, cu_seqlens: Any,
             mla_rotary_interleaved: Any = False) -> bool:
    """Whether megatron's `apply_rotary_pos_emb` would take its unfused, non-interleaved sbhd
    path over all of t's last dim: the case `one_pass_rope` computes."""
    d = t.shape[-1]
    return (cu_seqlens is None
            and not getattr(config, "apply_rope_fusion", False)
            and not getattr(config, "rotary_interleaved", False)
            and not getattr(config, "multi_latent_attention", False)
            and not mla_rotary_interleaved
            and freqs.shape[-1] == d and d % 2 == 0
            and not freqs.requires_grad
            and _broadcasts_to(freqs.shape, t.shape))


def make_dispatcher(original):
    """`apply_rotary_pos_emb` with megatron's signature (0.16: up to `cp_group`; 0.19 adds
    `mla_rotary_interleaved`): the plain case in one pass, anything else to `original`."""

    def apply_rotary_pos_emb(t, freqs, config, cu_seqlens=None, mscale=1.0, cp_group=None,
                             *more, **kwargs):
        mla = kwargs.get("mla_rotary_interleaved", more[0] if more else False)
        known = len(more) <= 1 and set(kwargs) <= {"mla_rotary_interleaved"}
        if known and is_plain(t, freqs, config, cu_seqlens, mla):
            return one_pass_rope(t, freqs, mscale)
        return original(t, freqs, config, cu_seqlens, mscale, cp_group, *more, **kwargs)

    apply_rotary_pos_emb.__wrapped__ = original
    return apply_rotary_pos_emb


def _apply() -> bool:
    attention = import_or_none(TARGET)
    if attention is None:
        return False
    return replace_attr(attention, ATTR, make_dispatcher, NAME)


PATCH = Patch(name=NAME, fixes=__doc__.split("\n\n")[0], apply=_apply)
