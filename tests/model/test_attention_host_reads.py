"""Every backend derives its representation of the split without reading the device: the split
is checked once on the host (`check_split` -> `CheckedSplit`) and only then moved, and the
varlen offsets and maximum lengths come from the host lengths."""
from __future__ import annotations

import pytest
import torch

from host_reads import HostReads
from megatron_biglm.model.attention_backends import BACKENDS
from megatron_biglm.model.attention_params import build_attention_params
from megatron_biglm.objective.split_rule import CheckedSplit, check_split, checked_split


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_host_read_free_derive_for_every_backend(backend, padded):
    split = torch.tensor([3, 0, 17, 9])  # the loader's host tensors
    valid = torch.tensor([20, 24, 24, 12]) if padded else None
    with HostReads() as reads:
        params = build_attention_params(split, 24, backend, valid_lengths=valid, device="cpu")
    assert params.derived is not None
    assert reads.reads == []


def test_host_read_of_a_device_split_is_what_the_host_check_avoids():
    """The same check on a split already moved to the device reads it back (the counter's
    proof that the host check is what keeps the derive free of reads)."""
    with HostReads() as reads:
        build_attention_params(torch.tensor([3, 0, 17, 9]).to("cpu"), 24, "sdpa", device="cpu")
    assert any(name == "any().__bool__" for name, _ in reads.reads), reads.reads


def test_checked_split_is_checked_once_and_travels_typed():
    checked = check_split(torch.tensor([2, 0, 5]), 8, torch.tensor([8, 6, 5]))
    assert isinstance(checked, CheckedSplit) and checked.seq_len == 8
    assert checked.valid.tolist() == [8, 6, 5]
    moved = checked.to("cpu")
    assert checked_split(moved, 8) == (moved.split, moved.valid)  # not checked again
    with pytest.raises(ValueError, match="carries its own valid lengths"):
        checked_split(moved, 8, torch.tensor([8, 8, 8]))
    assert check_split(torch.zeros(3, dtype=torch.long), 8) is None  # nothing restricted
    assert check_split(None, 8, torch.full((3,), 8)) is None
    with pytest.raises(ValueError, match="split must lie in"):
        check_split(torch.tensor([2, 7, 1]), 8, torch.tensor([8, 6, 5]))
