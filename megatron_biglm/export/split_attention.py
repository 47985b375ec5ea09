"""BiGLM's prefix/suffix split on an exported (native EuroBERT) HF model, via a 4D mask.

EuroBERT has no `split` argument, but its mask builder passes a 4D ``attention_mask`` through
unchanged. The mask must be *additive* (0 = attend, dtype-min = blocked): the eager attention
adds it to the scores, so a boolean mask would be silently wrong there, while sdpa accepts
either. flash-attention and flex kernels take no such tensor, so they are refused.

The rule itself (prefix queries never see suffix keys) comes from
`megatron_biglm.objective.split_mask`, the same function the megatron model is trained with.
"""
from __future__ import annotations

import torch

from megatron_biglm.objective.split_mask import dense_split_mask

#: HF attention implementations that accept an additive [b, 1, s, s] float mask.
MASKABLE_ATTENTION = ("eager", "sdpa")


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`[b, 1, q, k]` float mask from a bool `[b, q, k]` (True = may attend): 0 where allowed,
    the dtype's minimum elsewhere. Finite, so fully masked padding rows stay finite (their
    outputs are never read)."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    blocked = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, blocked)[:, None]


def split_attention_mask(split: torch.Tensor | None, seq_len: int, *,
                         attention_mask: torch.Tensor | None = None,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """The `attention_mask` to pass to an HF BiGLM/EuroBERT model for a batch of splits.

    `split` ([b] prefix lengths) None means full attention: the 2D padding mask (or None) is
    returned as is. Otherwise returns ``[b, 1, s, s]`` additive `dtype` mask: query i may see
    key j iff (j < split or i >= split) and key j is not padding (`attention_mask` [b, s],
    1 = real token, any padding side).
    """
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be the 2D [batch, seq] padding mask, got shape "
                         f"{tuple(attention_mask.shape)}; the split mask is built here")
    if split is None:
        return attention_mask
    split = torch.as_tensor(split)
    blocked = dense_split_mask(split, seq_len)
    if attention_mask is not None:
        if tuple(attention_mask.shape) != (blocked.shape[0], seq_len):
            raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} does not match "
                             f"[batch={blocked.shape[0]}, seq={seq_len}]")
        blocked = blocked | (attention_mask.to(blocked.device) == 0)[:, None, None, :]
    device = attention_mask.device if attention_mask is not None else split.device
    return additive_mask(~blocked[:, 0].to(device), dtype)


def forward_with_split(model, input_ids: torch.Tensor, split: torch.Tensor | None = None,
                       attention_mask: torch.Tensor | None = None, **kwargs):
    """`model(input_ids, attention_mask=...)` with BiGLM's split applied (None = full attention).

    `model` is any HF masked LM taking a 4D additive mask (our export: `EuroBertForMaskedLM`).
    """
    if split is not None:
        impl = getattr(model.config, "_attn_implementation", None)
        if impl not in MASKABLE_ATTENTION:
            raise ValueError(
                f"attention implementation {impl!r} cannot take BiGLM's split mask; load the model "
                f"with attn_implementation in {MASKABLE_ATTENTION} (e.g. "
                "AutoModelForMaskedLM.from_pretrained(dir, attn_implementation='sdpa'))")
        attention_mask = split_attention_mask(
            split, input_ids.shape[1], attention_mask=attention_mask, dtype=model.dtype)
    return model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
