"""`row_linear_tp_group`: megatron's row-parallel linear compiles as one graph (its tp_group=None
deprecation warning no longer breaks it) and computes what it did."""
from __future__ import annotations

import pytest
import torch
from megatron.core.tensor_parallel import layers as tp_layers
from megatron.core.transformer import TransformerConfig

from megatron_biglm.patches import row_linear_tp_group


@pytest.fixture(scope="module", autouse=True)
def megatron_groups():
    from model_fixtures import init_megatron

    init_megatron()


def _row_linear():
    cfg = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2, use_cpu_initialization=True)
    torch.manual_seed(0)
    return tp_layers.RowParallelLinear(16, 8, config=cfg, init_method=torch.nn.init.normal_, bias=False,
                                       input_is_parallel=True, skip_bias_add=True)


def _compiled_output(layer, x):
    import torch._dynamo

    torch._dynamo.reset()
    return torch.compile(lambda t: layer(t)[0], backend="eager", fullgraph=True)(x)


@pytest.mark.slow
def test_row_linear_compiles_as_one_graph_with_the_patch_and_not_without():
    layer, x = _row_linear(), torch.randn(3, 2, 16)
    original = tp_layers.RowParallelLinear._forward_impl
    if getattr(original, "__biglm_patch__", None) == row_linear_tp_group.NAME:
        original = original.__wrapped__
    try:
        tp_layers.RowParallelLinear._forward_impl = original
        with pytest.raises(Exception, match="warn"):
            _compiled_output(layer, x)
        assert row_linear_tp_group.PATCH.apply()
        torch.testing.assert_close(_compiled_output(layer, x), x @ layer.weight.t())
        assert row_linear_tp_group.PATCH.apply()  # a second application changes nothing
    finally:
        row_linear_tp_group.PATCH.apply()
