"""What an attention backend is: the `AttentionBackend` Protocol, and what it derives with.

A backend is one object that says whether it runs here (and why not), its dtypes and whether
it has attention dropout, what it derives from a batch's checked split on the host (a dense
mask, a FlexAttention block mask, varlen offsets, ...), its forward, and its line in the
kernel report. `registry.py` holds the registered ones; `core_attention.BiGLMCoreAttention`
dispatches to them by name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol, runtime_checkable

import torch

from megatron_biglm.objective.split_rule import CheckedSplit

#: the dtypes of the fp16/bf16-only kernels (flash-attn, torch's varlen attention)
HALF_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class DeriveOptions:
    """What a backend may need besides the split to derive its representation."""

    #: where the forward runs (None: where the split is)
    device: Optional[torch.device] = None
    #: FlexAttention's block size
    flex_block_size: int = 128
    #: run FlexAttention compiled (`attention_params.resolve_compile`)
    compile_flex: bool = False


@runtime_checkable
class AttentionBackend(Protocol):
    """One attention kernel of BiGLM's core attention.

    `forward(core, query, key, value, derived)` takes megatron's layouts, q `[sq, b, nq, d]`
    and k/v `[sk, b, ng, d]` (ng <= nq: GQA), and returns `[sq, b, nq, d]` (or already
    `[sq, b, nq * d]`). `derived` is what `derive` returned for this forward, or None for full
    attention (split None or all 0, and no padded row): then the fastest full-attention kernel
    runs instead, unless `megatron_native`. `core` is the calling `BiGLMCoreAttention`:
    `core.softmax_scale`, `core.attention_dropout_p()` (0 outside training), and
    `core.unfused(...)`, megatron's own `DotProductAttention.forward`.

    A backend class may subclass this Protocol for its defaults: any dtype, dropout supported,
    not megatron's own, available everywhere.
    """

    #: the name a config gives (`model.attention_backend`)
    name: str
    #: the compute dtypes it runs in; None: any
    dtypes: Optional[tuple] = None
    #: whether it applies attention dropout
    supports_dropout: bool = True
    #: megatron's own unfused attention: it masks full attention itself and forks megatron's
    #: RNG for dropout itself (the others run inside that fork)
    megatron_native: bool = False

    def unavailable(self, *, training: bool = True) -> Optional[str]:
        """None when it runs on this machine (and trains, with `training`), else why not and
        what to install or choose instead."""
        return None

    def derive(self, split: CheckedSplit, options: DeriveOptions) -> Any:
        """Its representation of the split rule, built on the host from the checked host split
        (move to `options.device` what the kernel reads there)."""

    def forward(self, core, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                derived: Any) -> torch.Tensor:
        """Attention under the derived representation (see the class docstring for layouts)."""

    def describe(self, dtype: torch.dtype, options: DeriveOptions) -> str:
        """The kernel in words, for the kernel report."""
