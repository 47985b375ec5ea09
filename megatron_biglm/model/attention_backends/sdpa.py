"""`sdpa`: torch's scaled_dot_product_attention with the dense `[b, 1, s, s]` visible mask
(the CPU default); with nothing derived, plain full attention."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from megatron_biglm.model.attention_masks import dense_visible_mask

from .protocol import AttentionBackend, DeriveOptions


def sdpa_attention(core, query, key, value, mask) -> torch.Tensor:
    """SDPA over megatron's `[s, b, h, d]` layout; `mask` True = attend (None: full)."""
    q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, h, s, d]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=core.attention_dropout_p(),
                                         scale=core.softmax_scale, enable_gqa=q.shape[1] != k.shape[1])
    return out.permute(2, 0, 1, 3)  # [s, b, h, d]


class SdpaBackend(AttentionBackend):
    name = "sdpa"

    def derive(self, split, options: DeriveOptions) -> torch.Tensor:
        return dense_visible_mask(split.to(options.device), split.seq_len)

    def forward(self, core, query, key, value, derived) -> torch.Tensor:
        return sdpa_attention(core, query, key, value, derived)

    def describe(self, dtype, options) -> str:  # noqa: ARG002
        return "torch scaled_dot_product_attention with a dense mask"
