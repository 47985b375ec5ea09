"""TokenIds: THE record of a tokenizer's special ids, for the dataset and for inference.

Why one small frozen record and not the tokenizer: the masked-LM dataset needs only ids (mask,
the never-masked specials, vocab size), so workers pickle nothing heavy and the cache key
(megatron hashes ``config.tokenizer.unique_identifiers``) is stable across tokenizer objects;
the inference adapters and scoring rules need the same ids (BOS opens every model input, MASK
fills the slots, PAD fills padding that is never attended to, EOS closes documents).

The fallback rule (BOS and EOS in ``from_tokenizer``, PAD on construction, so every record has
a PAD and no consumer needs a rule of its own; the same choices ``load_tokenizer`` makes when it
completes a tokenizer):
  * BOS: the tokenizer's BOS, else CLS (BERT family), else None;
  * EOS: the tokenizer's EOS, else SEP, else None;
  * PAD: the tokenizer's PAD, else EOS, else MASK (padding is never attended to, so any id
    works; PAD = EOS is what decoder tokenizers do and costs no embedding row);
  * MASK: required (the model is a masked LM).
What each consumer additionally needs is checked where it is used, with ``require``: the
dataset needs EOS (documents end with it), scoring and generation need BOS.
Megatron's view (``MegatronTokenIds``) treats PAD = EOS as "no PAD", so real EOS tokens are never
taken for padding.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True)
class TokenIds:
    """Special token ids. ``special_ids``: every id that must never be masked (EOS/BOS/PAD/...;
    mask itself too). ``vocab_size`` (None when unknown) bounds every id given."""

    mask_id: int
    eos_id: int | None = None
    pad_id: int | None = None
    bos_id: int | None = None
    vocab_size: int | None = None
    special_ids: tuple[int, ...] = field(default=())

    def __post_init__(self):
        if self.pad_id is None:  # padding is never attended to nor read: any id will do
            object.__setattr__(self, "pad_id", self.eos_id if self.eos_id is not None else self.mask_id)
        ids = {int(i) for i in self.special_ids}
        ids.update(i for i in (self.eos_id, self.pad_id, self.bos_id, self.mask_id) if i is not None)
        object.__setattr__(self, "special_ids", tuple(sorted(ids)))
        if self.mask_id is None:
            raise ValueError("mask_id is required: the model is a masked LM")
        if self.vocab_size is not None:
            for name in ("mask_id", "eos_id", "pad_id", "bos_id"):
                value = getattr(self, name)
                if value is not None and not 0 <= int(value) < self.vocab_size:
                    raise ValueError(f"{name}={value} must be an id in [0, vocab_size={self.vocab_size})")

    def require(self, *names: str, why: str) -> "TokenIds":
        """Self, or ValueError naming the missing ids and why the caller needs them."""
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise ValueError(f"the tokenizer has no {', '.join(missing)} ({why}); set the token "
                             "on the tokenizer (or load it with megatron_biglm.data.tokenizer."
                             "load_tokenizer, which adds the missing ones)")
        return self

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> "TokenIds":
        """From an HF tokenizer, with the fallback rule of the module docstring."""
        mask = tokenizer.mask_token_id
        if mask is None:
            raise ValueError(
                f"tokenizer {type(tokenizer).__name__} has no mask token; set tokenizer.mask_token "
                "(e.g. '<mask>' or '[MASK]') or load it with load_tokenizer(..., add_mask_token=True)")
        bos = _first(tokenizer, "bos_token_id", "cls_token_id")
        eos = _first(tokenizer, "eos_token_id", "sep_token_id")
        pad = _first(tokenizer, "pad_token_id")
        try:
            vocab = len(tokenizer)
        except TypeError:  # a tokenizer-like object without a length: ids stay unbounded
            vocab = None
        specials = getattr(tokenizer, "all_special_ids", None) or ()
        return cls(mask_id=int(mask), eos_id=eos, pad_id=pad, bos_id=bos, vocab_size=vocab,
                   special_ids=tuple(int(i) for i in specials))


def _first(tokenizer: Any, *attributes: str) -> int | None:
    for name in attributes:
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    return None


class MegatronTokenIds:
    """The duck-typed tokenizer megatron-core's GPTDatasetConfig/MegatronDataset read.

    They use ``vocab_size``, ``eod``, ``pad`` and ``unique_identifiers`` (for the cache hash).
    ``pad`` is megatron's sentinel −1 when pad aliases eos, so real EOS tokens are never
    treated as padding (windows are always full, so padding never occurs anyway).
    """

    def __init__(self, ids: TokenIds):
        ids.require("eos_id", why="documents end with EOS: megatron's datasets need it as `eod`")
        if ids.vocab_size is None:
            raise ValueError("the dataset needs TokenIds.vocab_size (from_tokenizer sets it)")
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

