"""The masked-LM loss fused over the predicted rows equals the plain one, loss and gradients.

`fused_linear_cross_entropy` projects and scores the predicted rows a chunk at a time and
recomputes the logits in its backward; it must give the same per-row losses and the same
gradients of the hidden states and of the (tied) output weight as projecting every row and
taking cross entropy, with megatron's vocabulary padding masked out, for any chunk size and
any incoming per-row gradient (the loss mask may hold weights). The model's training loss
takes this path at TP=1 (`test_model.py` holds it to the full-logits loss end to end).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model_fixtures import build_model, init_megatron, tiny_config

from megatron_biglm.model.loss import _fusable, fused_linear_cross_entropy, mask_padded_vocab


def _reference(hidden, weight, targets, vocab_size):
    logits = mask_padded_vocab((hidden @ weight.t()).float(), vocab_size, weight.shape[0])
    return F.cross_entropy(logits, targets, reduction="none")


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_fused_loss_equals_the_plain_loss_and_gradients(chunk):
    g = torch.Generator().manual_seed(chunk)
    for draw in range(5):
        n, h, padded = int(torch.randint(0, 20, (1,), generator=g)) if draw else 0, 16, 40  # 0: nothing predicted
        vocab = padded - int(torch.randint(0, 8, (1,), generator=g))  # some padding rows, or none
        hidden = (torch.randn(n, h, generator=g) * 2).requires_grad_(True)
        weight = torch.randn(padded, h, generator=g).requires_grad_(True)
        targets = torch.randint(0, vocab, (n,), generator=g)
        upstream = torch.rand(n, generator=g) * 3  # per-row weights of the loss mask
        got = fused_linear_cross_entropy(hidden, weight, targets, vocab, chunk=chunk)
        (got * upstream).sum().backward()
        got_grads = hidden.grad.clone(), weight.grad.clone()
        hidden.grad = weight.grad = None
        want = _reference(hidden, weight, targets, vocab)
        (want * upstream).sum().backward()
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got_grads[0], hidden.grad, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got_grads[1], weight.grad, atol=1e-5, rtol=1e-5)
        assert float(weight.grad[vocab:].abs().sum()) == 0.0  # padding rows learn nothing


def test_fused_loss_in_bf16_stays_within_bf16_rounding_of_fp32():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(50, 32, generator=g)
    weight = torch.randn(64, 32, generator=g) * 0.3
    targets = torch.randint(0, 60, (50,), generator=g)
    got = fused_linear_cross_entropy(hidden.bfloat16(), weight.bfloat16(), targets, 60, chunk=16)
    want = _reference(hidden.bfloat16().float(), weight.bfloat16().float(), targets, 60)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=5e-2, rtol=2e-2)


def test_fused_loss_is_what_the_model_trains_with_at_tp1():
    init_megatron(1, 1)
    model = build_model(tiny_config(vocab_size=190))
    weight = model.output_projection_weight()
    assert _fusable(model.output_layer, weight if weight is not None else model.output_layer.weight)
