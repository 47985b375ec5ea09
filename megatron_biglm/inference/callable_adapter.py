"""An adapter over a plain forward function, for models that are not HF models.

The training loop's megatron model (any TP/PP layout, run in-process) only has to expose
`forward(input_ids [b, s], allowed [b, 1, s, s]) -> logits [b, s, V]`, where `allowed` is a
bool mask, True where a query may attend to a key. Megatron's arbitrary-mask attention uses the
opposite convention (True = masked out), so a megatron wrapper passes `~allowed`. No prefix
cache: this path recomputes the context every pass, which is fine for a small in-training suite.
"""
from __future__ import annotations

from typing import Callable

import torch

from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.model.attention_masks import sequence_mask

from .protocol import MaskedLMAdapter

ForwardFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class CallableMaskedLMAdapter(MaskedLMAdapter):
    """`split_attention=False` for models trained without the restriction (full attention)."""

    def __init__(self, forward: ForwardFn, special: TokenIds, *, max_length: int,
                 device: torch.device | str = "cpu", split_attention: bool = True):
        self.forward = forward
        self.special = special
        self.max_length = int(max_length)
        self.split_attention = bool(split_attention)
        self.prefix_cache = False
        self._device = torch.device(device)

    @property
    def device(self) -> torch.device:
        return self._device

    def logits(self, input_ids, lengths, split, positions):
        allowed = sequence_mask(lengths, input_ids.shape[1],
                                split if self.split_attention else None)[:, None]
        out = self.forward(input_ids, allowed)
        return out.gather(1, positions[..., None].expand(-1, -1, out.shape[-1]))

    def describe(self):
        return {**super().describe(), "split_mode": "callable" if self.split_attention else "none"}
