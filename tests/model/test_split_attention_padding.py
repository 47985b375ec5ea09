"""`split_attention_mask`'s split is an absolute index: with left padding it includes the pads."""
from __future__ import annotations

import torch

from megatron_biglm.export.split_attention import split_attention_mask


def test_left_padding_needs_the_split_shifted_by_the_pads():
    seq, pads, prefix = 8, 3, 2
    real = seq - pads
    unpadded = split_attention_mask(torch.tensor([prefix]), real)[0, 0]
    left = torch.tensor([[0] * pads + [1] * real])
    shifted = split_attention_mask(torch.tensor([pads + prefix]), seq, attention_mask=left)[0, 0]
    assert torch.equal(shifted[pads:, pads:], unpadded)  # the real tokens see what they should
    assert (shifted[:, :pads] == torch.finfo(torch.float32).min).all()  # and never a pad
    naive = split_attention_mask(torch.tensor([prefix]), seq, attention_mask=left)[0, 0]
    assert not torch.equal(naive[pads:, pads:], unpadded)  # the unshifted split is wrong
