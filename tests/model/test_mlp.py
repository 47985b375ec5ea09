"""BiGLM's MLP (model/mlp.py): its SwiGLU, with the input gradient written into one buffer, gives
megatron-core's MLP's outputs and gradients exactly, in the setting BiGLM uses and outside it."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.mlp import MLP, MLPSubmodules

from megatron_biglm.model.mlp import BiGLMMLP, swiglu
from model_fixtures import init_megatron, tiny_config


def test_swiglu_equals_chunk_silu_mul_in_value_and_gradient():
    g = torch.Generator().manual_seed(0)
    for trial in range(10):
        s, b, f = (int(v) for v in torch.randint(1, 9, (3,), generator=g))
        gate_up = (torch.randn(s, b, 2 * f, generator=g) * 4).requires_grad_()
        grad = torch.randn(s, b, f, generator=g)
        gate, up = torch.chunk(gate_up, 2, dim=-1)
        reference = F.silu(gate) * up
        (expected,) = torch.autograd.grad(reference, gate_up, grad)
        out = swiglu(gate_up)
        (got,) = torch.autograd.grad(out, gate_up, grad)
        assert torch.equal(out, reference)
        assert torch.equal(got, expected) and got.is_contiguous()


def _pair(transformer_config):
    """megatron's MLP and ours, same config, same weights."""
    submodules = MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
    torch.manual_seed(0)
    theirs = MLP(transformer_config, submodules, ffn_hidden_size=transformer_config.ffn_hidden_size)
    ours = BiGLMMLP(transformer_config, submodules, ffn_hidden_size=transformer_config.ffn_hidden_size)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def _run(mlp, hidden, grad):
    hidden = hidden.clone().requires_grad_()
    out, bias = mlp(hidden)
    out.backward(grad)
    grads = {name: p.grad.clone() for name, p in mlp.named_parameters() if p.grad is not None}
    return out.detach(), bias, hidden.grad, grads


@pytest.mark.parametrize("setting", ["biglm", "glu_offset", "bias"])
def test_biglm_mlp_matches_megatron_mlp(setting):
    """The BiGLM setting runs `swiglu`; the others fall through to megatron's forward. Either way
    the output, the input gradient and every weight gradient equal megatron's MLP's."""
    init_megatron(1, 1)
    tc = tiny_config().to_transformer_config()
    if setting == "glu_offset":
        tc = dataclasses.replace(tc, glu_linear_offset=1.0)
    elif setting == "bias":
        tc = dataclasses.replace(tc, add_bias_linear=True)
    theirs, ours = _pair(tc)
    assert ours._plain_swiglu() == (setting == "biglm")
    g = torch.Generator().manual_seed(1)
    for trial in range(3):
        hidden = torch.randn(7, 3, tc.hidden_size, generator=g)
        grad = torch.randn(7, 3, tc.hidden_size, generator=g)
        expected, got = _run(theirs, hidden, grad), _run(ours, hidden, grad)
        theirs.zero_grad(), ours.zero_grad()
        assert torch.equal(got[0], expected[0])
        assert (got[1] is None) == (expected[1] is None)
        if got[1] is not None:
            assert torch.equal(got[1], expected[1])
        assert torch.equal(got[2], expected[2])
        assert got[3].keys() == expected[3].keys()
        for name in expected[3]:
            assert torch.equal(got[3][name], expected[3][name]), name
