"""BiGLM's core attention: megatron's `DotProductAttention` with selectable kernels.

Subclassing keeps megatron's constructor (per-partition head counts under TP, softmax scale,
dropout) and its unfused forward, which stays available as the `local` backend: the reference
every other backend is tested against. The other backends read the mask representation from
`BiGLMAttentionParams` (see `attention_params`), built once per forward by the model:

  sdpa  torch SDPA with the dense bool mask (CPU default)
  flex  FlexAttention with a BlockMask; compiled or eager as the params say (the model config's
        `attention_compile`: auto = compiled on CUDA). On CPU forward only, compiled or not
        (torch 2.13 has no FlexAttention backward there): evaluation, not training
  flash flash-attn varlen, two calls (prefix->prefix, suffix->all); no s x s tensor anywhere
  sdpa_split  two SDPA calls per group of samples sharing a split (prefix->prefix,
        suffix->valid keys), no mask: flash/cuDNN SDPA on CUDA, on any device
  varlen  one call of torch's varlen attention (CUDA) over [prefix, suffix] segments, the
        prefix keys gathered twice; only the visible pairs are computed
Full attention (no mask: variants `mlm`/`no_attn`) uses flash-attn when present (CUDA, fp16 or
bf16), else SDPA, whatever the configured backend: it is the fastest kernel for that case.

Prefix cache (inference): while a forward's `LayerKV` ports are attached (`kv_ports_attached`,
one per layer, resolved by the model before the layers run), each layer's post-RoPE key and
value pass through its port before the kernel (see `kv_cache.py`); nothing else changes here.

Layouts: megatron hands q [sq, b, nq, d] and k/v [sk, b, ng, d] (ng <= nq: GQA) and wants
[sq, b, nq*d] back.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.transformer.dot_product_attention import DotProductAttention

from . import attention_params
from .attention_masks import grouped_split_sdpa, split_varlen_attention, varlen_split_attention
from .attention_params import FLASH_MISSING, TORCH_VARLEN_MISSING, BiGLMAttentionParams


@functools.lru_cache(maxsize=2)
def flex_attention_fn(compiled: bool):
    """FlexAttention, compiled (fused kernel, no s x s scores) or eager (materialises scores)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False) if compiled else flex_attention


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


def flash_attn_functions():
    """(flash_attn_func, flash_attn_varlen_func), or ImportError saying how to get them."""
    try:
        from flash_attn import flash_attn_func, flash_attn_varlen_func
    except ImportError as exc:
        raise ImportError(FLASH_MISSING) from exc
    return flash_attn_func, flash_attn_varlen_func


def torch_varlen_fn(q, k, v, cu_q, cu_k, max_q: int, max_k: int, softmax_scale=None, causal=False):
    """torch's varlen attention behind flash-attn's `flash_attn_varlen_func` signature. GQA is
    passed through where this torch's `varlen_attn` takes `enable_gqa`, else K/V heads are
    repeated."""
    import inspect

    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as exc:
        raise ImportError(TORCH_VARLEN_MISSING) from exc
    if causal:
        raise NotImplementedError("the split objective only needs non-causal varlen attention")
    extra = {}
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in inspect.signature(varlen_attn).parameters:
            extra["enable_gqa"] = True
        else:
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, scale=softmax_scale, **extra)


class BiGLMCoreAttention(DotProductAttention):
    """Drop-in `core_attention` for megatron's SelfAttention; dispatches on the params' backend."""

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
        attn_mask_type=None,
        attention_bias: Optional[torch.Tensor] = None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        if attention_bias is not None:
            raise NotImplementedError("BiGLM attention takes no attention_bias")
        params = packed_seq_params
        if params is None:
            # A megatron-style caller with a plain dense mask (or none): the sdpa path.
            params = BiGLMAttentionParams(backend="sdpa", dense_mask=attention_mask)
        elif not isinstance(params, BiGLMAttentionParams):
            raise NotImplementedError(
                "packed (thd) sequences are not supported by BiGLM attention; pass `split` "
                "(and `valid_lengths` for padding) to the model instead"
            )
        if self.kv_port is not None:
            # Inference prefix cache: record this layer's keys/values, attend to cached + new.
            key, value = self.kv_port.update(key, value)
        if params.backend == "local":
            return super().forward(query, key, value, params.dense_mask, attn_mask_type)
        with self._dropout_rng():
            if params.backend == "flash" or (
                params.is_full_attention and query.is_cuda and query.dtype in attention_params.FLASH_DTYPES
                and attention_params.flash_attn_available()
            ):
                out = self._flash(query, key, value, params)
            elif params.backend == "flex" and not params.is_full_attention:
                out = self._flex(query, key, value, params)
            elif params.groups is not None:
                out = self._sdpa_split(query, key, value, params)
            elif params.segments is not None:
                out = self._varlen(query, key, value, params)
            else:
                out = self._sdpa(query, key, value, params)
        sq, b = query.shape[:2]
        return out.reshape(sq, b, -1)

    # ------------------------------------------------------------------ kernels
    def _dropout(self) -> float:
        return self.dropout_p if self.training else 0.0

    def _dropout_rng(self):
        """Dropout under TP must draw from megatron's model-parallel RNG, as the parent does."""
        if self._dropout() > 0 and not self.config.sequence_parallel:
            return tensor_parallel.get_cuda_rng_tracker().fork()
        return contextlib.nullcontext()

    def _sdpa(self, query, key, value, params: BiGLMAttentionParams) -> torch.Tensor:
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, h, s, d]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=params.sdpa_mask(), dropout_p=self._dropout(), scale=self.softmax_scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )
        return out.permute(2, 0, 1, 3)  # [s, b, h, d]

    def _sdpa_split(self, query, key, value, params: BiGLMAttentionParams) -> torch.Tensor:
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, h, s, d]
        sdpa = functools.partial(F.scaled_dot_product_attention, dropout_p=self._dropout(),
                                 scale=self.softmax_scale, enable_gqa=q.shape[1] != k.shape[1])
        return grouped_split_sdpa(q, k, v, params.groups, sdpa).permute(2, 0, 1, 3)

    def _varlen(self, query, key, value, params: BiGLMAttentionParams) -> torch.Tensor:
        if self._dropout() > 0:
            raise NotImplementedError("torch's varlen attention has no attention dropout; use attention_backend "
                                      "sdpa_split or sdpa with attention_dropout > 0")
        q, k, v = (t.transpose(0, 1) for t in (query, key, value))  # [b, s, h, d]
        out = varlen_split_attention(q, k, v, params.segments, torch_varlen_fn, softmax_scale=self.softmax_scale)
        return out.transpose(0, 1)

    def _flex(self, query, key, value, params: BiGLMAttentionParams) -> torch.Tensor:
        if self._dropout() > 0:
            raise NotImplementedError(
                "FlexAttention has no attention dropout; use attention_backend sdpa or flash "
                "with attention_dropout > 0"
            )
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        flex = flex_attention_fn(compiled=params.compile_flex)
        try:
            out = flex(
                q, k, v, block_mask=params.block_mask, scale=self.softmax_scale,
                enable_gqa=q.shape[1] != k.shape[1],
            )
        except NotImplementedError as exc:
            if "backward on CPU" not in str(exc):
                raise
            raise NotImplementedError(
                f"{exc} (torch {torch.__version__}, compiled or not). To train on CPU set "
                "model.attention_backend to sdpa or auto; flex on CPU is for evaluation"
            ) from exc
        return out.permute(2, 0, 1, 3)

    def _flash(self, query, key, value, params: BiGLMAttentionParams) -> torch.Tensor:
        flash_attn_func, flash_attn_varlen_func = flash_attn_functions()
        q, k, v = (t.transpose(0, 1) for t in (query, key, value))  # [b, s, h, d]
        if params.varlen is None:
            out = flash_attn_func(
                q, k, v, dropout_p=self._dropout(), softmax_scale=self.softmax_scale, causal=False
            )
        else:
            varlen_fn = functools.partial(flash_attn_varlen_func, dropout_p=self._dropout())
            out = split_varlen_attention(
                q, k, v, params.varlen, varlen_fn=varlen_fn, softmax_scale=self.softmax_scale
            )
        return out.transpose(0, 1)

