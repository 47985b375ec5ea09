"""RMSNorm for megatron-core layers, including under sequence parallelism.

Why not megatron's `WrappedTorchNorm`: it refuses `sequence_parallel` ("not supported by torch
LayerNorm", megatron-core 0.16.1), and the norms that support it need Transformer Engine or
apex. RMSNorm is per token, so sequence parallelism only needs the weight's gradient summed
over the tensor-parallel group; marking the weight `sequence_parallel` makes megatron's
`finalize_model_grads` do exactly that.
"""
from __future__ import annotations

import torch


class BiGLMRMSNorm(torch.nn.RMSNorm):
    """`torch.nn.RMSNorm` with megatron's norm constructor signature; its weight is created in
    `params_dtype` on the device megatron creates the other weights on."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **unused_megatron_kwargs):
        if config.normalization != "RMSNorm":
            raise ValueError(f"BiGLM uses RMSNorm, got config.normalization={config.normalization!r}")
        on_gpu = torch.cuda.is_available() and not config.use_cpu_initialization
        super().__init__(
            hidden_size, eps=eps, dtype=config.params_dtype,
            device=torch.cuda.current_device() if on_gpu else "cpu",
        )
        setattr(self.weight, "sequence_parallel", bool(config.sequence_parallel))
