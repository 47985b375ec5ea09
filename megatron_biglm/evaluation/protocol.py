"""The masked-LM scorer protocol that the scoring rules are written against.

Why a protocol: every rule (beam, oneshot, pll, l2r) only needs log-probabilities at chosen
positions of `prefix + suffix`, where `prefix = [BOS] + context` and the suffix holds the
continuation slots. Any model that can produce those logits -- an HF `AutoModelForMaskedLM`,
our megatron model inside the training loop, a test double -- is then scored by the same code.

Split attention: with `split = len(prefix)`, rows `< split` see only columns `< split`, rows
`>= split` see every non-padding column (BiGLM's training pattern). Because prefix rows never
see the suffix, an adapter may encode the prefix once and reuse its keys/values for every
suffix (`encode_prefix` / `logits_with_prefix`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class SpecialTokens:
    """Token ids the rules need. `pad_id` only fills padding (it is never attended to)."""

    bos_id: int
    mask_id: int
    pad_id: int
    eos_id: int | None = None

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "SpecialTokens":
        """BOS falls back to CLS (BERT family), EOS to SEP, PAD to EOS then MASK."""
        mask = tokenizer.mask_token_id
        if mask is None:
            raise ValueError(
                f"tokenizer {type(tokenizer).__name__} has no mask token; masked-LM scoring needs "
                "one (set tokenizer.mask_token, e.g. '<mask>' or '[MASK]', before evaluating)")
        bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
        if bos is None:
            raise ValueError(
                f"tokenizer {type(tokenizer).__name__} has neither a BOS nor a CLS token; the scoring "
                "input is [BOS] + context + [MASK]*n, so set tokenizer.bos_token first")
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = eos if eos is not None else mask
        return cls(bos_id=int(bos), mask_id=int(mask), pad_id=int(pad),
                   eos_id=None if eos is None else int(eos))


class MaskedLMAdapter(ABC):
    """What a model must provide to be scored.

    Attributes set by subclasses:
      special: the token ids above.
      max_length: the longest `prefix + suffix` the model accepts.
      split_attention: True when `split` is honoured (see module docstring); False means the
        model runs full attention whatever `split` says, and prefix reuse is then impossible.
      prefix_cache: True when `encode_prefix`/`logits_with_prefix` are implemented and exact.
    """

    special: SpecialTokens
    max_length: int
    split_attention: bool = False
    prefix_cache: bool = False

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """Where input tensors must live."""

    @abstractmethod
    def logits(self, input_ids: torch.Tensor, lengths: torch.Tensor, split: torch.Tensor | None,
               positions: torch.Tensor) -> torch.Tensor:
        """Logits `[b, k, V]` at `positions [b, k]` of right-padded `input_ids [b, s]`.

        `lengths [b]` counts real tokens per row; `split [b]` (or None for full attention) is
        the prefix length of each row."""

    def encode_prefix(self, prefix_ids: torch.Tensor, prefix_lengths: torch.Tensor) -> Any:
        """Encode right-padded prefixes `[g, p]` once; returns an opaque state."""
        raise NotImplementedError(f"{type(self).__name__} does not cache prefixes")

    def logits_with_prefix(self, state: Any, rows: torch.Tensor, suffix_ids: torch.Tensor,
                           suffix_lengths: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits `[b, k, V]` at suffix `positions [b, k]` of suffixes `[b, q]` that follow the
        cached prefixes `rows [b]` (indices into the state), with split = prefix length."""
        raise NotImplementedError(f"{type(self).__name__} does not cache prefixes")

    def describe(self) -> dict[str, Any]:
        """What the results JSON records about how this model was run."""
        return {"split_attention": self.split_attention, "prefix_cache": self.prefix_cache,
                "max_length": self.max_length}
