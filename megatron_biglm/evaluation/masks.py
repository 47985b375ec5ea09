"""Split attention masks for models that take a 4D attention mask (HF BERT, EuroBERT/BiGLM).

One rule covers both the full sequence and the cached-prefix case: a query at absolute
position i may see a key at absolute position j iff the key is real (not padding) and
`j < split or i >= split`. With prefix caching the queries are suffix rows only, so they see
every real key, and the keys are laid out `[prefix (padded), suffix (padded)]`.
"""
from __future__ import annotations

import torch

from megatron_biglm.export.split_attention import additive_mask  # noqa: F401 - re-exported


def allowed_keys(query_pos: torch.Tensor, key_pos: torch.Tensor, key_valid: torch.Tensor,
                 split: torch.Tensor | None) -> torch.Tensor:
    """Bool `[b, q, k]`, True where the query may attend to the key.

    query_pos [b, q], key_pos [b, k]: absolute positions; key_valid [b, k]: not padding;
    split [b] or None (full attention among real keys)."""
    allowed = key_valid[:, None, :].expand(-1, query_pos.shape[1], -1)
    if split is not None:
        split = split[:, None, None]
        allowed = allowed & ((key_pos[:, None, :] < split) | (query_pos[:, :, None] >= split))
    return allowed


def sequence_mask(lengths: torch.Tensor, seq_len: int, split: torch.Tensor | None) -> torch.Tensor:
    """Bool `[b, s, s]` for right-padded rows of `lengths` with an optional split."""
    pos = torch.arange(seq_len, device=lengths.device)[None, :].expand(lengths.shape[0], -1)
    return allowed_keys(pos, pos, pos < lengths[:, None], split)


def suffix_after_prefix_mask(prefix_lengths: torch.Tensor, prefix_width: int,
                             suffix_lengths: torch.Tensor, suffix_width: int) -> torch.Tensor:
    """Bool `[b, q, p + q]`: suffix queries over keys `[padded prefix, padded suffix]`."""
    device = prefix_lengths.device
    b = prefix_lengths.shape[0]
    p_idx = torch.arange(prefix_width, device=device)[None, :].expand(b, -1)
    s_idx = torch.arange(suffix_width, device=device)[None, :].expand(b, -1)
    key_valid = torch.cat([p_idx < prefix_lengths[:, None], s_idx < suffix_lengths[:, None]], dim=1)
    key_pos = torch.cat([p_idx, prefix_lengths[:, None] + s_idx], dim=1)
    query_pos = prefix_lengths[:, None] + s_idx
    return allowed_keys(query_pos, key_pos, key_valid, prefix_lengths)
