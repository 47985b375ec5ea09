"""TokenIds: the few tokenizer facts the masked-LM dataset needs, and megatron's view of them.

The dataset needs only ids (mask, the never-masked specials, vocab size), not a tokenizer:
keeping them in a small frozen record means workers pickle nothing heavy and the cache key
(megatron hashes ``config.tokenizer.unique_identifiers``) is stable across tokenizer objects.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TokenIds:
    """``special_ids``: every id that must never be masked (EOS/BOS/PAD/...; mask itself too)."""

    vocab_size: int
    mask_id: int
    eos_id: int
    pad_id: int | None = None
    bos_id: int | None = None
    special_ids: tuple[int, ...] = field(default=())

    def __post_init__(self):
        ids = {int(i) for i in self.special_ids}
        ids.update(i for i in (self.eos_id, self.pad_id, self.bos_id, self.mask_id) if i is not None)
        object.__setattr__(self, "special_ids", tuple(sorted(ids)))
        for name, value in (("mask_id", self.mask_id), ("eos_id", self.eos_id)):
            if value is None or not 0 <= int(value) < self.vocab_size:
                raise ValueError(f"{name}={value} must be an id in [0, vocab_size={self.vocab_size})")

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> "TokenIds":
        """From an HF tokenizer (e.g. ``megatron_biglm.data.tokenizer.load_tokenizer``'s)."""
        if tokenizer.mask_token_id is None:
            raise ValueError("the tokenizer has no mask token; load it with load_tokenizer(..., add_mask_token=True)")
        return cls(
            vocab_size=len(tokenizer),
            mask_id=tokenizer.mask_token_id,
            eos_id=tokenizer.eos_token_id,
            pad_id=tokenizer.pad_token_id,
            bos_id=tokenizer.bos_token_id,
            special_ids=tuple(tokenizer.all_special_ids),
        )


class MegatronTokenIds:
    """The duck-typed tokenizer megatron-core's GPTDatasetConfig/MegatronDataset read.

    They use ``vocab_size``, ``eod``, ``pad`` and ``unique_identifiers`` (for the cache hash).
    ``pad`` is megatron's sentinel −1 when pad aliases eos, so real EOS tokens are never
    treated as padding (windows are always full, so padding never occurs anyway).
    """

    def __init__(self, ids: TokenIds):
        self.ids = ids
        self.vocab_size = ids.vocab_size
        self.eod = ids.eos_id
        self.pad = ids.pad_id if ids.pad_id not in (None, ids.eos_id) else -1
        self.unique_identifiers = {
            "class": "TokenIds",
            "vocab_size": ids.vocab_size,
            "eod": ids.eos_id,
            "mask": ids.mask_id,
            "special_ids": list(ids.special_ids),
        }

    @property
    def special_tokens_dict(self) -> dict:
        return {"eos_token": self.ids.eos_id, "mask_token": self.ids.mask_id}
