"""The split mask, built once per forward, in the representation the attention backend needs.

"The split point travels one way": the batch carries `split` ([b] prefix lengths); the model
calls `build_attention_params` once per forward, and the resulting `BiGLMAttentionParams`
reaches every layer's core attention through megatron's `packed_seq_params` argument.

Why `packed_seq_params` and not `attention_mask`: megatron-core's activation recompute
(`recompute_granularity` full or selective) passes `attention_mask` through
`tensor_parallel.checkpoint`, whose `save_for_backward` accepts tensors only, so a BlockMask or
a VarlenSplit there would crash; `packed_seq_params` reaches the core attention by closure.
`qkv_format="sbhd"` keeps megatron's own code on its non-packed path.

Representations (one per backend, nothing else is built; all from `model.attention_masks`,
which derives them from the one rule in `objective.split_rule`):
  sdpa, local -> `dense_mask` [b,1,s,s] bool, True = masked out (megatron's convention)
  flex        -> `block_mask`, a FlexAttention BlockMask (built analytically: no s x s tensor)
  flash       -> `varlen`, the cu_seqlens/indices of the two flash-attn varlen calls
  sdpa_split  -> `groups`, samples grouped by split: two mask-free SDPA calls per group
  varlen      -> `segments`, one torch varlen call (torch.nn.attention.varlen, CUDA) over
                 [prefix, suffix] segments, the prefix keys gathered twice
  all None    -> full bidirectional attention: split None or all 0 (variants `mlm`, `no_attn`
                 emit split 0), and no padded row (valid_lengths None, or all = seq_len)
A cached forward's keys/values go through per-layer ports, not these params (`kv_cache.py`).
"""
from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from megatron.core.packed_seq_params import PackedSeqParams

from megatron_biglm.objective.split_rule import restricting_lengths, restricting_split

from .attention_masks import (SplitGroups, VarlenSegments, VarlenSplit, dense_split_mask, flex_split_block_mask,
                              split_groups, varlen_segments, varlen_split_lengths)
from .config import ATTENTION_BACKENDS, ATTENTION_COMPILE

FLASH_MISSING = (
    "attention_backend 'flash' needs the flash-attn package (pip install flash-attn, or the "
    "'gpu' extra: pip install -e '.[gpu]') and a CUDA device; use 'flex' or 'sdpa' without it"
)


@functools.lru_cache(maxsize=1)
def flash_attn_available() -> bool:
    """CUDA and an importable flash-attn (cached: asked once per layer per step otherwise)."""
    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


FLASH_DTYPES = (torch.float16, torch.bfloat16)

TORCH_VARLEN_MISSING = (
    "attention_backend 'varlen' needs torch.nn.attention.varlen (torch >= 2.10) and a CUDA device; "
    "use 'sdpa_split', 'flex' or 'sdpa' without them"
)


@functools.lru_cache(maxsize=1)
def torch_varlen_available() -> bool:
    """CUDA and torch's own varlen attention (`torch.nn.attention.varlen.varlen_attn`)."""
    if not torch.cuda.is_available():
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


FLEX_NO_DROPOUT = (
    "attention_backend 'flex' has no attention dropout, and model.attention_dropout is {p}; "
    "set model.attention_backend=auto (sdpa, or flash where installed) or sdpa, or "
    "model.attention_dropout=0"
)


def resolve_backend(name: str, dtype: torch.dtype = torch.bfloat16, attention_dropout: float = 0.0) -> str:
    """The concrete backend for a configured name, compute dtype and attention dropout.

    `auto` picks flash (CUDA, flash-attn installed, fp16/bf16: its only dtypes) > varlen (CUDA,
    torch's varlen attention, fp16/bf16) > flex (CUDA) > sdpa: the kernels that skip the
    masked pairs before the one that skips masked blocks, before the dense mask. flex and
    varlen have no attention dropout, so with `attention_dropout > 0` auto skips them (flash
    > sdpa, which applies `dropout_p`), and an explicit `flex` or `varlen` is refused here, at
    model build, before any dataset is opened (the paper's Table 1/2/8 trial runs set dropout 0.1).
    """
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend {name!r} is not one of {ATTENTION_BACKENDS}")
    if name == "auto":
        if flash_attn_available() and dtype in FLASH_DTYPES:
            return "flash"
        if torch_varlen_available() and dtype in FLASH_DTYPES and not attention_dropout:
            return "varlen"
        return "flex" if torch.cuda.is_available() and not attention_dropout else "sdpa"
    if name in ("flex", "varlen") and attention_dropout:
        raise ValueError(FLEX_NO_DROPOUT.format(p=attention_dropout).replace("'flex'", f"'{name}'"))
    if name in _HALF_PRECISION_KERNELS:
        available, missing, kernel, others = _HALF_PRECISION_KERNELS[name]
        if not available():
            raise ImportError(missing)
        if dtype not in FLASH_DTYPES:
            raise ValueError(f"{kernel} computes in fp16/bf16 only, the model is {dtype}; "
                             f"train in bf16 or use attention_backend {others}")
    return name


#: backend -> (is it installed here, what to install, the kernel in words, what else to use):
#: the kernels that run in fp16/bf16 only.
_HALF_PRECISION_KERNELS = {
    "flash": (flash_attn_available, FLASH_MISSING, "flash-attn", "flex or sdpa"),
    "varlen": (torch_varlen_available, TORCH_VARLEN_MISSING, "torch's varlen attention", "sdpa_split, flex or sdpa"),
}


def resolve_compile(setting: "bool | str", device: "torch.device | str") -> bool:
    """Whether the flex kernel is compiled, for a configured `attention_compile` and the
    device the model runs on: `auto` compiles on CUDA only, `True`/`False` as given."""
    if setting not in ATTENTION_COMPILE or not isinstance(setting, (bool, str)):
        raise ValueError(f"attention_compile must be 'auto', True or False, got {setting!r}")
    if setting == "auto":
        return torch.device(device).type == "cuda"
    return bool(setting)


@dataclass
class BiGLMAttentionParams(PackedSeqParams):
    """Per-forward attention description; see the module docstring for which field is set."""

    qkv_format: str = "sbhd"
    backend: str = "sdpa"
    dense_mask: Optional[torch.Tensor] = None
    block_mask: Any = None
    #: flex only: run the kernel compiled (torch.compile) rather than eagerly
    compile_flex: bool = False
    varlen: Optional[VarlenSplit] = None
    groups: Optional[SplitGroups] = None
    segments: Optional[VarlenSegments] = None

    _sdpa_mask: Optional[torch.Tensor] = field(default=None, repr=False)

    @property
    def is_full_attention(self) -> bool:
        return (self.dense_mask is None and self.block_mask is None and self.varlen is None
                and self.groups is None and self.segments is None)

    def __post_init__(self):
        parent = getattr(super(), "__post_init__", None)  # megatron-core 0.19 has one, 0.16 none
        if parent is not None:
            parent()
        # Inverted here, before any layer runs: a compiled layer then reads a tensor, never a
        # cache it fills on the first layer (which would compile the layer twice).
        if self.dense_mask is not None and self.backend == "sdpa":
            self._sdpa_mask = ~self.dense_mask

    def sdpa_mask(self) -> Optional[torch.Tensor]:
        """`dense_mask` in SDPA's convention (True = attend), inverted once and shared by all layers."""
        if self._sdpa_mask is None and self.dense_mask is not None:
            self._sdpa_mask = ~self.dense_mask
        return self._sdpa_mask


def build_attention_params(
    split: Optional[torch.Tensor],
    seq_len: int,
    backend: str,
    *,
    valid_lengths: Optional[torch.Tensor] = None,
    device: "torch.device | str | None" = None,
    flex_block_size: int = 128,
    compile_flex: bool = False,
) -> BiGLMAttentionParams:
    """Build the mask for `backend` (already resolved) from `split`.

    `split` None or all 0 means full attention (split 0 makes every row a suffix row), and
    `valid_lengths` None or all `seq_len` means no padding (the rule with valid = seq_len is the
    rule without it, so such lengths are dropped); with neither, no mask is built at all. Both
    are checked as given, so pass the batch's CPU tensors to keep the checks free of a device
    sync: the builders move what they need to `device`. With right padding (`valid_lengths`)
    and no split, the split rule with split = valid_lengths is exactly "attend to valid keys
    only", so padding reuses the same builders. `compile_flex` (see `resolve_compile`) says
    whether the flex kernel runs compiled; the other backends ignore it. The flex BlockMask is
    computed from per-block arithmetic (`flex_split_block_mask`'s analytic method): no s x s
    grid and no torch.compile, on any device.
    """
    if backend not in ("sdpa", "local", "flex", "flash", "sdpa_split", "varlen"):
        raise ValueError(f"build_attention_params needs a resolved backend, got {backend!r}")
    split = restricting_split(split)
    valid_lengths = restricting_lengths(valid_lengths, seq_len)
    if split is None and valid_lengths is None:
        return BiGLMAttentionParams(backend=backend)
    if split is None:
        split = valid_lengths
    if backend == "sdpa_split":  # built on the host from the host tensors: no device sync
        return BiGLMAttentionParams(backend=backend, groups=split_groups(split, seq_len, valid_lengths=valid_lengths))
    if backend == "varlen":
        segments = varlen_segments(split, seq_len, valid_lengths=valid_lengths)
        return BiGLMAttentionParams(backend=backend, segments=segments.to(device) if device is not None else segments)
    if device is not None:
        split = split.to(device)
        valid_lengths = valid_lengths.to(device) if valid_lengths is not None else None
    if backend in ("sdpa", "local"):
        mask = dense_split_mask(split, seq_len, valid_lengths=valid_lengths)
        return BiGLMAttentionParams(backend=backend, dense_mask=mask)
    if backend == "flex":
        block_mask = flex_split_block_mask(
            split, seq_len, block_size=flex_block_size, valid_lengths=valid_lengths
        )
        return BiGLMAttentionParams(backend=backend, block_mask=block_mask, compile_flex=compile_flex)
    return BiGLMAttentionParams(
        backend=backend, varlen=varlen_split_lengths(split, seq_len, valid_lengths=valid_lengths)
    )
