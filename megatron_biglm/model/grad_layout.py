"""The gradient that enters the trunk from its head, in the trunk's own memory layout.

The trunk runs sequence-first ([s, b, h], megatron's layout); the heads and the hidden-state
output read it batch-first ([b, s, h]) through a transpose. The transpose's backward hands the
trunk a gradient that is a transposed view (batch-major memory), and every elementwise op of
the backward keeps the layout of its input, so the whole residual stream's gradient stays
transposed: each linear's backward copies it to contiguous memory again (`.contiguous()` on the
gradient, `reshape` in the matmul) and the norms' and activations' backward mix the two layouts.
One copy where the gradient enters the trunk puts the whole backward back in [s, b, h] order;
the values are the same, only where they lie in memory changes.
"""
from __future__ import annotations

import torch


class _ContiguousGrad(torch.autograd.Function):
    """Identity forward; the backward hands on its gradient in contiguous memory."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.view_as(hidden)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def contiguous_grad(hidden: torch.Tensor) -> torch.Tensor:
    """`hidden` itself (a view of it), whose gradient reaches the layers before it contiguous."""
    if not hidden.requires_grad:
        return hidden
    return _ContiguousGrad.apply(hidden)


__all__ = ["contiguous_grad"]
