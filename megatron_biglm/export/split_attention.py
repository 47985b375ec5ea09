"""BiGLM's prefix/suffix split on an exported (native EuroBERT) HF model, via a 4D mask.

EuroBERT has no `split` argument, but its mask builder passes a 4D ``attention_mask`` through
unchanged. The mask must be *additive* (0 = attend, dtype-min = blocked): the eager attention
adds it to the scores, so a boolean mask would be silently wrong there, while sdpa accepts
either. flash-attention and flex kernels take no such tensor, so they are refused.

The mask comes from `megatron_biglm.model.attention_masks.additive_split_mask`, derived from the
one rule (`objective.split_rule.visible`) the megatron model is trained with.
"""
from __future__ import annotations

import torch

from megatron_biglm.model.attention_masks import additive_mask, additive_split_mask

__all__ = ["MASKABLE_ATTENTION", "additive_mask", "forward_with_split", "split_attention_mask"]

#: HF attention implementations that accept an additive [b, 1, s, s] float mask.
MASKABLE_ATTENTION = ("eager", "sdpa")


def split_attention_mask(split: torch.Tensor | None, seq_len: int, *,
                         attention_mask: torch.Tensor | None = None,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """The `attention_mask` to pass to an HF BiGLM/EuroBERT model for a batch of splits.

    `split` ([b] prefix lengths) None means full attention: the 2D padding mask (or None) is
    returned as is. Otherwise returns ``[b, 1, s, s]`` additive `dtype` mask: query i may see
    key j iff (j < split or i >= split) and key j is not padding (`attention_mask` [b, s],
    1 = real token). `split` is an absolute position in the padded row: with right padding it
    is the prefix length; with left padding it must include the padding (pads + prefix length),
    otherwise the prefix is cut short by the number of pads.
    """
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be the 2D [batch, seq] padding mask, got shape "
                         f"{tuple(attention_mask.shape)}; the split mask is built here")
    if split is None:
        return attention_mask
    return additive_split_mask(split, seq_len, attention_mask=attention_mask, dtype=dtype)


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
