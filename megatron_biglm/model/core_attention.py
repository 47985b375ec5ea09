"""BiGLM's core attention: megatron's `DotProductAttention` with registered kernels.

Subclassing keeps megatron's constructor (per-partition head counts under TP, softmax scale,
dropout) and its unfused forward, which stays available as the `local` backend: the reference
every other backend is tested against. The kernels are the registered `AttentionBackend`s
(`attention_backends/`, one file each); the params (`attention_params.BiGLMAttentionParams`,
built once per forward by the model) name the backend and carry what it derived from the
split. Full attention (nothing derived: variants `mlm`/`no_attn`, no padding) runs the fastest
unmasked kernel (`attention_backends/full.py`), whatever the configured backend, except
megatron's own.

Prefix cache (inference): while a forward's `LayerKV` ports are attached (`kv_ports_attached`,
one per layer, resolved by the model before the layers run), each layer's post-RoPE key and
value pass through its port before the kernel (see `kv_cache.py`); nothing else changes here.

Layouts: megatron hands q [sq, b, nq, d] and k/v [sk, b, ng, d] (ng <= nq: GQA) and wants
[sq, b, nq*d] back.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch
from megatron.core import tensor_parallel
from megatron.core.transformer.dot_product_attention import DotProductAttention

from .attention_backends import get_backend
from .attention_backends.full import full_attention
from .attention_params import BiGLMAttentionParams


@contextlib.contextmanager
def kv_ports_attached(layers, ports):
    """Hand each transformer layer's core attention its port for one forward, and take them
    back after it (also when it raises). The ports are resolved before any layer runs, so a
    compiled layer reads a ready object and never looks itself up by its layer number."""
    cores = [layer.self_attention.core_attention for layer in layers]
    if len(cores) != len(ports):
        raise ValueError(f"{len(ports)} kv ports for {len(cores)} layers")
    for core, port in zip(cores, ports):
        core.kv_port = port
    try:
        yield
    finally:
        for core in cores:
            core.kv_port = None


class BiGLMCoreAttention(DotProductAttention):
    """Drop-in `core_attention` for megatron's SelfAttention; dispatches to the params' backend."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dropout_p = float(self.attention_dropout.p)
        #: this layer's `kv_cache.LayerKV` during a cached forward, else None
        self.kv_port = None

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        attn_mask_type=None,  # noqa: ARG002 - megatron's signature; the mask is never causal
        attention_bias: Optional[torch.Tensor] = None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        if attention_bias is not None:
            raise NotImplementedError("BiGLM attention takes no attention_bias")
        params = packed_seq_params
        if params is None:
            # A megatron-style caller with a plain dense mask (True = masked out) or none: sdpa.
            params = BiGLMAttentionParams(backend="sdpa", derived=None if attention_mask is None else ~attention_mask)
        elif not isinstance(params, BiGLMAttentionParams):
            raise NotImplementedError(
                "packed (thd) sequences are not supported by BiGLM attention; pass `split` "
                "(and `valid_lengths` for padding) to the model instead"
            )
        if self.kv_port is not None:
            # Inference prefix cache: record this layer's keys/values, attend to cached + new.
            key, value = self.kv_port.update(key, value)
        backend = get_backend(params.backend)
        if backend.megatron_native:
            return backend.forward(self, query, key, value, params.derived)
        with self._dropout_rng():
            if params.derived is None:
                out = full_attention(self, query, key, value)
            else:
                out = backend.forward(self, query, key, value, params.derived)
        sq, b = query.shape[:2]
        return out.reshape(sq, b, -1)

    # ------------------------------------------------------------------ what backends call
    def unfused(self, query, key, value, attention_mask) -> torch.Tensor:
        """megatron's own unfused attention (`DotProductAttention.forward`) under `attention_mask`
        (True = masked out; None: full attention)."""
        return super().forward(query, key, value, attention_mask)  # megatron ignores attn_mask_type

    def attention_dropout_p(self) -> float:
        """The attention dropout to apply now: the configured one in training, else 0."""
        return self.dropout_p if self.training else 0.0

    def _dropout_rng(self):
        """Dropout under TP must draw from megatron's model-parallel RNG, as the parent does."""
        if self.attention_dropout_p() > 0 and not self.config.sequence_parallel:
            return tensor_parallel.get_cuda_rng_tracker().fork()
        return contextlib.nullcontext()
