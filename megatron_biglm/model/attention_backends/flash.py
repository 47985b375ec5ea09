"""`flash`: flash-attn's varlen kernel, two calls (prefix -> prefix, suffix -> all valid
keys) over offsets built from the host lengths; no s x s tensor anywhere. CUDA, fp16/bf16."""
from __future__ import annotations

import functools
import importlib.util

import torch

from megatron_biglm.model.attention_masks import VarlenSplit, split_varlen_attention, varlen_split_lengths

from .protocol import HALF_DTYPES, DeriveOptions

FLASH_MISSING = (
    "attention_backend 'flash' needs the flash-attn package (pip install flash-attn "
    "--no-build-isolation, or the 'gpu' extra: pip install -e '.[gpu]') and a CUDA device; "
    "use 'flex' or 'sdpa' without it"
)


@functools.lru_cache(maxsize=1)
def flash_attn_available() -> bool:
    """CUDA and an importable flash-attn (cached: asked once per layer per step otherwise)."""
    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


def flash_attn_functions():
    """(flash_attn_func, flash_attn_varlen_func), or ImportError saying how to get them."""
    try:
        from flash_attn import flash_attn_func, flash_attn_varlen_func  # lazy: optional (gpu extra)
    except ImportError as exc:
        raise ImportError(FLASH_MISSING) from exc
    return flash_attn_func, flash_attn_varlen_func


def flash_full_attention(core, query, key, value) -> torch.Tensor:
    """Unmasked attention with flash-attn's kernel, megatron's `[s, b, h, d]` layout."""
    flash_attn_func, _ = flash_attn_functions()
    q, k, v = (t.transpose(0, 1) for t in (query, key, value))  # [b, s, h, d]
    out = flash_attn_func(q, k, v, dropout_p=core.attention_dropout_p(), softmax_scale=core.softmax_scale,
                          causal=False)
    return out.transpose(0, 1)


class FlashBackend:
    name = "flash"
    dtypes = HALF_DTYPES
    supports_dropout = True
    megatron_native = False

    def unavailable(self, *, training: bool = True) -> str | None:  # noqa: ARG002 - the Protocol's signature
        return None if flash_attn_available() else FLASH_MISSING

    def derive(self, split, options: DeriveOptions) -> VarlenSplit:
        varlen = varlen_split_lengths(split, split.seq_len)  # offsets from the host lengths
        return varlen.to(options.device) if options.device is not None else varlen

    def forward(self, core, query, key, value, derived: VarlenSplit) -> torch.Tensor:
        _, flash_attn_varlen_func = flash_attn_functions()
        q, k, v = (t.transpose(0, 1) for t in (query, key, value))  # [b, s, h, d]
        varlen_fn = functools.partial(flash_attn_varlen_func, dropout_p=core.attention_dropout_p())
        out = split_varlen_attention(q, k, v, derived, varlen_fn=varlen_fn, softmax_scale=core.softmax_scale)
        return out.transpose(0, 1)

    def describe(self, dtype, options) -> str:  # noqa: ARG002
        return f"flash-attn varlen ({dtype})"
