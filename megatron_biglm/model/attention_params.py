"""The split mask, built once per forward, in the representation the attention backend needs.

"The split point travels one way": the batch carries `split` ([b] prefix lengths); the model
calls `build_attention_params` once per forward, which checks the split once on the host
(`objective.split_rule.check_split`) and asks the configured backend (`attention_backends`)
to derive its representation from it; the resulting `BiGLMAttentionParams` reaches every
layer's core attention through megatron's `packed_seq_params` argument.

Why `packed_seq_params` and not `attention_mask`: megatron-core's activation recompute
(`recompute_granularity` full or selective) passes `attention_mask` through
`tensor_parallel.checkpoint`, whose `save_for_backward` accepts tensors only, so a BlockMask or
a VarlenSplit there would crash; `packed_seq_params` reaches the core attention by closure.
`qkv_format="sbhd"` keeps megatron's own code on its non-packed path.

`derived` None is full bidirectional attention: split None or all 0 (variants `mlm`,
`no_attn` emit split 0), and no padded row (valid_lengths None, or all = seq_len).
A cached forward's keys/values go through per-layer ports, not these params (`kv_cache.py`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from megatron.core.packed_seq_params import PackedSeqParams

from megatron_biglm.objective.split_rule import check_split

from .attention_backends import DeriveOptions, get_backend, resolve_backend
from .attention_backends.flash import flash_attn_available
from .attention_backends.varlen import torch_varlen_available
from .config import ATTENTION_COMPILE

__all__ = ["BiGLMAttentionParams", "build_attention_params", "flash_attn_available", "resolve_backend",
           "resolve_compile", "torch_varlen_available"]


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
    """Per-forward attention description: the backend's name and what it derived (None: full
    attention)."""

    qkv_format: str = "sbhd"
    backend: str = "sdpa"
    #: the backend's representation of the split rule (`AttentionBackend.derive`)
    derived: Any = None

    @property
    def is_full_attention(self) -> bool:
        return self.derived is None


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
    """Derive `backend`'s (already resolved) representation of `split`.

    `split` None or all 0 means full attention (split 0 makes every row a suffix row), and
    `valid_lengths` None or all `seq_len` means no padding; with neither, nothing is derived.
    Both are checked once, as given: pass the batch's CPU tensors to keep the checks free of a
    device sync (the backend moves what it needs to `device`). With right padding and no
    split, the rule with split = valid_lengths is exactly "attend to valid keys only".
    `compile_flex` (see `resolve_compile`) says whether the flex kernel runs compiled.
    """
    chosen = get_backend(backend)
    checked = check_split(split, seq_len, valid_lengths)  # once, on the tensors given
    if checked is None:
        return BiGLMAttentionParams(backend=backend)
    options = DeriveOptions(device=None if device is None else torch.device(device),
                            flex_block_size=flex_block_size, compile_flex=compile_flex)
    return BiGLMAttentionParams(backend=backend, derived=chosen.derive(checked, options))
