"""BiGLM pretraining objective: prefix/suffix split, masking, and the split attention mask.

Pure numpy/torch; no distributed code.

* :class:`ObjectiveConfig` (``config.py``): the knobs (variant, α, λ1/λ2, β ranges, token/span
  suffix, replacement policy); ``ObjectiveConfig.from_dict`` rejects unknown keys.
* :func:`apply_objective` (``apply.py``): one window -> input_ids, labels, loss_mask, split.
* ``selection.py``: exact-count token selection and span selection.
* ``split_mask.py``: the attention rule (q >= split or k < split) as a dense mask, a
  FlexAttention BlockMask, or the two flash-attn varlen calls; ``varlen_attention.py`` runs
  those two calls (with flash-attn on GPU, an SDPA emulation on CPU).
"""
from .apply import IGNORE_INDEX, apply_objective, draw_ratios, draw_split, eligible_positions
from .config import ObjectiveConfig
from .selection import select_spans, select_tokens, span_length_probs
from .split_mask import (
    UNMASKED_VARIANTS,
    VARIANTS,
    VarlenSplit,
    dense_split_mask,
    flex_split_block_mask,
    split_for_variant,
    varlen_split_lengths,
)
from .varlen_attention import sdpa_varlen_attention, split_varlen_attention

__all__ = [
    "IGNORE_INDEX",
    "ObjectiveConfig",
    "apply_objective",
    "draw_ratios",
    "draw_split",
    "eligible_positions",
    "select_spans",
    "select_tokens",
    "span_length_probs",
    "VARIANTS",
    "UNMASKED_VARIANTS",
    "VarlenSplit",
    "dense_split_mask",
    "flex_split_block_mask",
    "split_for_variant",
    "varlen_split_lengths",
    "sdpa_varlen_attention",
    "split_varlen_attention",
]
