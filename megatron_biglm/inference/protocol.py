"""The masked-LM model protocol that scoring (evaluation/) and decoding (generation/) use.

Why a protocol: every rule (beam, oneshot, pll, l2r) only needs log-probabilities at chosen
positions of `prefix + suffix`, where `prefix = [BOS] + context` and the suffix holds the
continuation slots. Any model that can produce those logits -- an HF `AutoModelForMaskedLM`,
our megatron model inside the training loop, a test double -- is then scored by the same code.

Split attention: with `split = len(prefix)`, rows `< split` see only columns `< split`, rows
`>= split` see every non-padding column (BiGLM's training pattern). Because prefix rows never
see the suffix, an adapter may encode the prefix once and reuse its keys/values for every
suffix (`encode_prefix` / `logits_with_prefix`).

Block-causal growth (generation): `extend_prefix` appends a block to a cached prefix. The
block's rows attend to the cached prefix and to the block itself; the cached rows keep what they
saw. After extending `P` by `B1` then `B2`, rows of P see P, rows of B1 see P + B1, rows of B2
see P + B1 + B2, and a suffix scored against that state sees all of them. Because no cached row
ever sees a later one, the cached keys/values stay exact.

`special` is THE special-token record (`megatron_biglm.data.token_ids.TokenIds`, re-exported by
`megatron_biglm.inference`); an adapter needs its `bos_id`, `mask_id` and `pad_id`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Protocol, Sequence, runtime_checkable

import torch

from megatron_biglm.data.token_ids import TokenIds

if TYPE_CHECKING:  # megatron-core is heavy to import; the type is only named here
    from megatron_biglm.model.heads import LengthCandidates


class MaskedLMAdapter(ABC):
    """What a model must provide to be scored.

    Attributes set by subclasses:
      special: the token ids above.
      max_length: the longest `prefix + suffix` the model accepts.
      embedding_rows: how many token ids the model embeds: an id at or past it has no row of
        its own (an index error on CPU, a device-side assert that breaks a CUDA context);
        None when the adapter cannot tell. Callers check ids against it before any forward.
      split_attention: True when `split` is honoured (see module docstring); False means the
        model runs full attention whatever `split` says, and prefix reuse is then impossible.
      prefix_cache: True when `encode_prefix`/`logits_with_prefix` are implemented and exact.
      length_buckets: padded widths are rounded up by this policy (`buckets.LengthBuckets`)
        before they reach the model, so compiled kernels see few shapes; None pads to the
        longest row. Set by the caller (loading, lm-eval's `length_buckets` model arg).
    """

    special: TokenIds
    max_length: int
    embedding_rows: int | None = None
    split_attention: bool = False
    prefix_cache: bool = False
    length_buckets: Any = None

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
        cached prefixes `rows [b]` (indices into the state, a host tensor: callers build it
        there), with split = prefix length."""
        raise NotImplementedError(f"{type(self).__name__} does not cache prefixes")

    def extend_prefix(self, state: Any, rows: torch.Tensor, block_ids: torch.Tensor,
                      block_lengths: torch.Tensor) -> Any:
        """A new state whose row i holds the cached prefix of `rows[i]` followed by
        `block_ids[i, :block_lengths[i]]` (right-padded `[b, q]`); the block's rows attend to
        that cached prefix and to the block itself, nothing after. Equal to encoding prefix +
        block fresh under that block-causal pattern. The old state stays valid."""
        raise NotImplementedError(f"{type(self).__name__} does not cache prefixes")

    def describe(self) -> dict[str, Any]:
        """What the results JSON records about how this model was run."""
        return {"split_attention": self.split_attention, "prefix_cache": self.prefix_cache,
                "max_length": self.max_length}


@runtime_checkable
class LengthPrediction(Protocol):
    """Capability: a CMLM length head. Adapters of a model with one have `predict_lengths`; the
    generator then takes its candidate lengths (and ranks them with their log-probabilities)
    from it when no fixed length is asked for."""

    def predict_lengths(self, prefix_ids: torch.Tensor, prefix_lengths: torch.Tensor, k: int) -> LengthCandidates:
        """Top-k target lengths of right-padded prefixes `[g, p]` (`[BOS] + source`), best first."""
        ...


@runtime_checkable
class BlockCausalLogits(Protocol):
    """Capability: a full forward under block-causal attention, with no cache.

    The uncached reference of `extend_prefix`: the same pattern, recomputed from the ids.
    Block-causal decoding without a cache needs it; an adapter that lacks it is refused when
    the decoder is built."""

    def block_causal_logits(self, input_ids: torch.Tensor, lengths: torch.Tensor, starts: torch.Tensor,
                            positions: torch.Tensor) -> torch.Tensor:
        """Logits `[b, k, V]` at `positions [b, k]` of right-padded `input_ids [b, s]`, where
        `starts [b, m]` are each row's block starts (`attention_masks.block_causal_mask`)."""
        ...


@runtime_checkable
class SlotPrefixes(Protocol):
    """Capability: prefixes kept in slots of a preallocated key/value pool that the caller
    manages (`model.kv_pool.KVSlotPool`: taken and given back between blocks, each with a valid
    length), so a server holds each request's prefix in its own slot from block to block
    instead of re-encoding it. Rows run after their slot's cached keys, under the split rule
    (each row sees the slot's cached keys and every real row of its own forward)."""

    def slot_pool(self, slots: int) -> Any:
        """The adapter's pool (a `KVSlots`), created with at least `slots` slots of
        `max_length` positions on first use."""
        ...

    def write_slots(self, slots: Sequence[int], ids: torch.Tensor, lengths: torch.Tensor) -> None:
        """Run right-padded rows `ids [b, q]` (`lengths [b]` real) after their slots' cached
        keys and append their keys/values to the slots (block-causal growth)."""
        ...

    def logits_after_slots(self, slots: Sequence[int], ids: torch.Tensor, lengths: torch.Tensor,
                           positions: torch.Tensor) -> torch.Tensor:
        """Logits `[b, k, V]` at `positions [b, k]` of rows `ids [b, q]` run after their
        slots' cached keys; the slots keep their length."""
        ...


def inference_token_ids(tokenizer) -> TokenIds:
    """The tokenizer's `TokenIds`, checked for what every model input needs: a BOS (or CLS),
    since inputs are `[BOS] + context + slots`."""
    return TokenIds.from_tokenizer(tokenizer).require(
        "bos_id", why="the model input is [BOS] + context + [MASK]*n, so set tokenizer.bos_token first")
