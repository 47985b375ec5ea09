"""Every representation of the split rule an attention kernel or model needs, one per module.

The rule itself is stated once, in :mod:`megatron_biglm.objective.split_rule` (``visible``:
a key is seen iff it is real and ``q >= split or k < split``; ``split = 0`` is full
attention). Here it is only *represented*:

* ``dense``: ``[b, 1, s, s]`` bool masks, in megatron's convention (True = masked out,
  :func:`dense_split_mask`) and SDPA's (True = attend, :func:`dense_visible_mask`); the
  ``[b, q, k]`` "may attend" masks of padded batches, of suffix rows over a cached prefix, and
  of block-causal generation (:func:`sequence_mask`, :func:`suffix_after_prefix_mask`,
  :func:`block_causal_mask`: the rule applied at every block start).
* ``additive``: ``[b, 1, q, k]`` float masks for HF models (0 = attend, dtype-min = blocked):
  :func:`additive_mask`, :func:`additive_split_mask`.
* ``flex``: the FlexAttention ``BlockMask`` (built analytically, no s x s tensor), whose
  ``mask_mod`` is the rule: :func:`flex_split_block_mask`.
* ``varlen``: the two flash-attn varlen calls (:class:`VarlenSplit`,
  :func:`varlen_split_lengths`; no s x s tensor) and ``varlen_attention``, which runs them
  with flash-attn's kernel or a CPU SDPA emulation (:func:`split_varlen_attention`,
  :func:`sdpa_varlen_attention`).
* ``segments``: only the visible blocks, as dense calls: two SDPA calls per group of samples
  sharing a split (:class:`SplitGroups`, :func:`grouped_split_sdpa`), or one varlen call whose
  keys reference the prefix twice (:class:`VarlenSegments`, :func:`varlen_split_attention`).

Pure torch: no megatron import, so evaluation and export can use it cheaply. A new
representation adds a module here, derived from ``visible`` and checked in
tests/objective/test_split_rule.py; the backends that use them are ``model/attention_backends/``.
"""
from .additive import additive_mask, additive_split_mask
from .dense import (block_causal_mask, dense_split_mask, dense_visible_mask, sequence_mask,
                    suffix_after_prefix_mask)
from .flex import FLEX_BUILD_METHODS, flex_split_block_mask
from .segments import (SplitGroups, VarlenSegments, grouped_split_sdpa, split_groups, varlen_segments,
                       varlen_split_attention)
from .varlen import VarlenSplit, varlen_split_lengths
from .varlen_attention import sdpa_varlen_attention, split_varlen_attention

__all__ = [
    "additive_mask", "additive_split_mask",
    "block_causal_mask", "dense_split_mask", "dense_visible_mask", "sequence_mask",
    "suffix_after_prefix_mask",
    "FLEX_BUILD_METHODS", "flex_split_block_mask",
    "VarlenSplit", "varlen_split_lengths",
    "sdpa_varlen_attention", "split_varlen_attention",
    "SplitGroups", "VarlenSegments", "grouped_split_sdpa", "split_groups", "varlen_segments",
    "varlen_split_attention",
]
