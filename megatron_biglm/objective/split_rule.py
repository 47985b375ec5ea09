"""THE split rule: which key a query may see, and which variants restrict attention at all.

A sample of length ``s`` is cut at ``split`` into a prefix X = [0, split) and a suffix
Y = [split, s). Prefix queries must not see the suffix (at inference there is no target yet);
suffix queries see everything. Padding keys are seen by nobody:

    visible(q, k) = k is a real token  and  (q >= split  or  k < split)

``split = 0`` makes every row a suffix row: full (bidirectional) attention over the real
tokens. That is how the variants without the restriction (``no_attn``, ``mlm``) are carried:
the data emits ``split = 0`` for them (:func:`attention_split`), so no flag travels beside
``split``. Every attention representation (dense, additive 4D, FlexAttention BlockMask, flash
varlen) is derived from :func:`visible` in ``megatron_biglm.model.attention_masks``; only this
module states the rule. Pure torch, no model code.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

#: Variants of the objective (see ``ObjectiveConfig.variant``).
VARIANTS = ("biglm", "no_attn", "mlm")


def restricts_attention(variant: str) -> bool:
    """Whether ``variant`` restricts prefix queries to the prefix: ``biglm`` only.

    ``no_attn`` ("w/o attn", Table 1) keeps the prefix/suffix masking but attends fully;
    ``mlm`` ("w/o both") has no split at all.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown objective variant {variant!r}; expected one of {VARIANTS}")
    return variant == "biglm"


def attention_split(cut, variant: str):
    """The split the attention sees for a masking cut: ``cut`` when ``variant`` restricts
    attention, else 0 (same type: an int stays an int, a tensor a tensor of zeros).

    The masking policy may still change at ``cut`` (``no_attn``); only attention ignores it.
    """
    if restricts_attention(variant):
        return cut
    return torch.zeros_like(cut) if isinstance(cut, torch.Tensor) else 0


def visible(q_idx: torch.Tensor, k_idx: torch.Tensor, split, valid_length=None, *,
            key_real: torch.Tensor | None = None) -> torch.Tensor:
    """True where the query at position ``q_idx`` may see the key at position ``k_idx``.

    All arguments broadcast against each other (index grids, per-sample ``[b, 1, 1]`` views,
    or the scalars a FlexAttention ``mask_mod`` receives). ``valid_length``: keys at
    ``k_idx >= valid_length`` are padding (right padding). ``key_real``: a bool per key, for
    layouts where padding is not a right tail (left padding, a padded cached prefix followed by
    a padded suffix); either, both or neither may be given.
    """
    allowed = (q_idx >= split) | (k_idx < split)
    if valid_length is not None:
        allowed = allowed & (k_idx < valid_length)
    if key_real is not None:
        allowed = allowed & key_real
    return allowed


def restricting_split(split: torch.Tensor | None) -> torch.Tensor | None:
    """``split``, or None when it restricts no row (None, or every entry 0).

    A consumer may then run plain full attention, with no mask at all. Call it on a CPU tensor
    (the batch as the loader gives it) to keep the check free of a device sync.
    """
    if split is None or not bool(torch.as_tensor(split).any()):
        return None
    return split


def restricting_lengths(valid_lengths: torch.Tensor | None, seq_len: int) -> torch.Tensor | None:
    """``valid_lengths``, or None when it pads no row (None, or every entry ``seq_len``).

    A row whose valid length is ``seq_len`` has no padding key, and the rule with
    ``valid = seq_len`` is the rule without ``valid_length``; so a batch whose rows are all full
    may drop its lengths, and with no restricting split either, run plain full attention with
    no mask at all. Call it on a CPU tensor (the batch as the loader gives it) to keep the check
    free of a device sync. A shape other than ``[batch]`` or an entry past ``seq_len`` is
    refused here, since dropping the lengths would otherwise hide it from :func:`checked_split`.
    """
    if valid_lengths is None:
        return None
    valid = torch.as_tensor(valid_lengths)
    if valid.dim() != 1:
        raise ValueError(f"valid_lengths must be a 1-D tensor [batch], got shape {tuple(valid.shape)}")
    if bool((valid < seq_len).any()):
        return valid_lengths
    if bool((valid > seq_len).any()):
        raise _valid_lengths_out_of_range(valid, seq_len)
    return None


def _valid_lengths_out_of_range(valid: torch.Tensor, seq_len: int) -> ValueError:
    return ValueError(f"valid_lengths must lie in [1, seq_len={seq_len}], got {valid.tolist()}")


@dataclass(frozen=True)
class CheckedSplit:
    """A batch's ``split`` and valid lengths after :func:`checked_split` has checked them once:
    int64 ``[b]`` tensors, ``0 <= split <= valid <= seq_len``.

    Check on the host (the loader's CPU tensors, where reading them is free), then move with
    :meth:`to`: every representation accepts a ``CheckedSplit`` in place of a raw split and
    does not check it again, so nothing on the device is read back to decide a mask.
    """

    split: torch.Tensor
    valid: torch.Tensor
    seq_len: int

    @property
    def device(self) -> torch.device:
        return self.split.device

    def to(self, device) -> "CheckedSplit":
        """The same split on ``device`` (asynchronous copies; no check is repeated)."""
        if device is None or torch.device(device) == self.split.device:
            return self
        return CheckedSplit(self.split.to(device, non_blocking=True), self.valid.to(device, non_blocking=True),
                            self.seq_len)


def check_split(split, seq_len: int, valid_lengths=None) -> CheckedSplit | None:
    """The :class:`CheckedSplit` of a batch, or None when it restricts nothing (no restricting
    split and no padded row: plain full attention). Without a restricting split, a padded batch
    is the rule with ``split = valid_lengths``. Pass host tensors: the checks read them."""
    split = restricting_split(split)
    valid_lengths = restricting_lengths(valid_lengths, seq_len)
    if split is None and valid_lengths is None:
        return None
    if split is None:
        split = valid_lengths
    return CheckedSplit(*checked_split(split, seq_len, valid_lengths), seq_len)


def checked_split(split, seq_len: int, valid_lengths=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(split, valid)`` as int64 ``[b]`` tensors after checking the rule's domain.

    ``0 <= split <= valid <= seq_len`` and ``valid >= 1``; ``valid`` is ``seq_len`` without
    padding. Every representation validates through here, so all fail the same clear way. A
    :class:`CheckedSplit` was checked already: its tensors come back as they are.
    """
    if isinstance(split, CheckedSplit):
        if split.seq_len != seq_len or valid_lengths is not None:
            raise ValueError(f"a CheckedSplit for seq_len {split.seq_len} carries its own valid lengths; "
                             f"got seq_len {seq_len} and valid_lengths={valid_lengths!r}")
        return split.split, split.valid
    split = torch.as_tensor(split)
    if split.dim() != 1:
        raise ValueError(f"split must be a 1-D tensor [batch], got shape {tuple(split.shape)}")
    if split.dtype.is_floating_point or split.dtype == torch.bool:
        raise TypeError(f"split must hold integer prefix lengths, got dtype {split.dtype}")
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    split = split.to(torch.int64)
    if valid_lengths is None:
        valid = torch.full_like(split, seq_len)
    else:
        valid = torch.as_tensor(valid_lengths, device=split.device).to(torch.int64)
        if valid.shape != split.shape:
            raise ValueError(
                f"valid_lengths shape {tuple(valid.shape)} must match split {tuple(split.shape)}"
            )
        if bool(((valid < 1) | (valid > seq_len)).any()):
            raise _valid_lengths_out_of_range(valid, seq_len)
    if bool(((split < 0) | (split > valid)).any()):
        raise ValueError(
            f"split must lie in [0, valid length] (seq_len={seq_len}), got {split.tolist()}; "
            "a split is a prefix length, not a position past the sequence"
        )
    return split, valid
