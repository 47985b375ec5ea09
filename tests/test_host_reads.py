"""The host-read checker (`host_reads.HostReads`) catches every data-dependent read of a
computed tensor, names it, and leaves host-provided tensors alone."""
from __future__ import annotations

import pytest
import torch

from host_reads import HostReads


def _computed():
    return torch.arange(6, device="cpu").float() - 2.0  # made with device=: the device's


READS = {
    "nonzero": lambda t: t.nonzero(),
    "masked_select": lambda t: t.masked_select(t > 0),
    "__getitem__[bool mask]": lambda t: t[t > 0],
    "__setitem__[bool mask]": lambda t: t.clone().__setitem__(t > 0, 0.0),
    "item": lambda t: t.sum().item(),
    "tolist": lambda t: t.tolist(),
    "__bool__": lambda t: bool(t[0] > 0),
    "__int__": lambda t: int(t[0]),
    "__float__": lambda t: float(t[0]),
    "equal": lambda t: torch.equal(t, t),
    "any().__bool__": lambda t: bool((t > 0).any()),
    "all().__bool__": lambda t: bool((t > 0).all()),
    "cpu": lambda t: t.cpu(),
    "unique": lambda t: t.unique(),
    "repeat_interleave": lambda t: t.repeat_interleave(t.long().clamp(min=0)),
}


@pytest.mark.parametrize("op", sorted(READS))
def test_host_read_of_a_computed_tensor_is_caught(op):
    with HostReads() as reads:
        READS[op](_computed())
    assert [name for name, _ in reads.reads] == [op]


@pytest.mark.parametrize("op", sorted(READS))
def test_host_read_of_a_host_tensor_is_not_flagged(op):
    with HostReads() as reads:
        host = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0, 3.0])
        READS[op](host * 2 + torch.arange(6))  # computed from host tensors alone: still the host's
    assert reads.reads == []


def test_host_read_after_a_move_to_the_device_is_caught():
    """On CPU `.to("cpu")` returns the tensor itself; on a GPU it would be the device's copy."""
    host = torch.tensor([0, 3, 0, 5])
    with HostReads() as reads:
        moved = host.to("cpu", non_blocking=True)
        moved.nonzero()
        host.nonzero()
        host.to(torch.float32).tolist()
        _computed().repeat_interleave(2)  # a fixed count: the output shape is known
    assert [name for name, _ in reads.reads] == ["nonzero"]


def test_host_read_of_a_parameter_is_caught_and_names_its_frame():
    from megatron_biglm.model.loss import predicted_rows

    weight = torch.nn.Parameter(torch.ones(2, 3))
    with HostReads() as reads:
        predicted_rows(weight * 2)
    assert len(reads.reads) == 1
    name, where = reads.reads[0]
    assert name == "nonzero" and "model/loss.py" in where
