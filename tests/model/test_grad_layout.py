"""The trunk's backward runs in its own [s, b, h] layout (model/grad_layout.py): a head that
reads the hidden states batch-first hands every layer a contiguous gradient, with the values a
plain transpose gives."""
from __future__ import annotations

import torch

from megatron_biglm.model.grad_layout import contiguous_grad
from model_fixtures import build_model, init_megatron, random_batch, tiny_config


def test_contiguous_grad_keeps_values_and_hands_on_contiguous_memory():
    g = torch.Generator().manual_seed(0)
    for trial in range(5):
        s, b, h = (int(v) for v in torch.randint(1, 7, (3,), generator=g))
        x = torch.randn(s, b, h, generator=g, requires_grad=True)
        weight = torch.randn(b, s, h, generator=g)
        y = contiguous_grad(x)
        assert torch.equal(y, x)
        (grad,) = torch.autograd.grad((y.transpose(0, 1) * weight).sum(), x)
        assert grad.is_contiguous() and torch.equal(grad, weight.transpose(0, 1))
    frozen = torch.randn(2, 3)
    assert contiguous_grad(frozen) is frozen


def test_every_layer_gets_a_contiguous_gradient_from_a_batch_first_head():
    init_megatron(1, 1)
    cfg = tiny_config()
    model = build_model(cfg, seed=3)
    batch = random_batch(cfg, batch=3, seq=16, seed=4)
    seen = []

    def keep_grad_layout(module, args, output):
        out = output[0] if isinstance(output, tuple) else output
        out.register_hook(lambda grad: seen.append(grad.is_contiguous()))

    for layer in model.decoder.layers:
        layer.register_forward_hook(keep_grad_layout)
    hidden = model(batch["input_ids"], split=batch["split"], return_hidden=True)  # [b, s, h]
    (hidden * torch.randn_like(hidden)).sum().backward()
    assert seen == [True] * cfg.num_layers
