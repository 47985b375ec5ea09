"""BiGLM pretraining objective: prefix/suffix split, masking, and the split rule.

Pure numpy/torch; no distributed code.

* :class:`ObjectiveConfig` (``config.py``): the knobs (variant, α, λ1/λ2, β ranges, token/span
  suffix, replacement policy); ``ObjectiveConfig.from_dict`` rejects unknown keys.
* :func:`apply_objective` (``apply.py``): one window -> input_ids, labels, loss_mask, split.
* ``selection.py``: exact-count token selection and span selection.
* ``split_rule.py``: THE attention rule (a key is seen iff it is real and q >= split or
  k < split; split 0 = full attention) and which variants restrict attention. Its
  representations (dense, additive, FlexAttention, flash varlen) live in
  ``megatron_biglm.model.attention_masks``.
"""
from .apply import IGNORE_INDEX, apply_objective, draw_ratios, draw_split, eligible_positions
from .config import ObjectiveConfig
from .selection import select_spans, select_tokens, span_length_probs
from .split_rule import VARIANTS, attention_split, restricts_attention, visible

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
    "attention_split",
    "restricts_attention",
    "visible",
]
