"""The optional CMLM length head: absent by default (state dict unchanged), reads only the
prefix, predicts lengths >= 1, is replicated under TP, and exports to its own file.
The learning side (trained through the loop, used by Mask-Predict) is test_seq2seq_learns."""
from __future__ import annotations

import torch

from model_fixtures import build_model, init_megatron, tiny_config


def test_model_without_the_head_is_unchanged_and_with_it_adds_two_tensors():
    init_megatron()
    plain = set(build_model(tiny_config()).state_dict())
    headed = build_model(tiny_config(length_head_max=6))
    assert not any("length" in k for k in plain)
    assert set(headed.state_dict()) - plain == {"length_head.weight", "length_head.bias"}
    assert tuple(headed.length_head.weight.shape) == (7, headed.config.hidden_size)


def test_length_logits_come_from_the_prefix_only_and_predictions_are_at_least_one():
    init_megatron()
    model = build_model(tiny_config(length_head_max=6)).eval()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(5, 200, (3, 12), generator=gen)
    other = tokens.clone()
    split = torch.tensor([4, 7, 5])
    for r in range(3):
        other[r, split[r]:] = torch.randint(5, 200, (12 - int(split[r]),), generator=gen)
    labels, loss_mask = tokens.clone(), torch.zeros(3, 12)
    loss_mask[:, -1] = 1
    with torch.no_grad():
        _, a = model(tokens, split=split, labels=labels, loss_mask=loss_mask, length_prefix=split)
        _, b = model(other, split=split, labels=labels, loss_mask=loss_mask, length_prefix=split)
    assert torch.allclose(a, b, atol=1e-6)  # the target never reaches the length head
    logits = torch.zeros(2, 7)
    logits[:, 0] = 10.0  # class 0 is the favourite, but a target has a token
    top = model.length_head.predict(logits, 3)
    assert (top.lengths >= 1).all()
    # log-probabilities among the lengths >= 1, best first
    assert torch.allclose(top.logprobs, torch.full((2, 3), -torch.log(torch.tensor(6.0))))


def test_length_head_is_replicated_under_tp_and_exported_beside_the_model():
    from megatron_biglm.export.tp_shards import tp_partition_dim
    from megatron_biglm.export.weight_table import sidecar_file

    assert tp_partition_dim("length_head.weight") is None and tp_partition_dim("length_head.bias") is None
    assert sidecar_file("length_head.weight") == "length_head.safetensors"
    assert sidecar_file("decoder.final_layernorm.weight") is None
