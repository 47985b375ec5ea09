"""Regional compilation (`model.compile_layers`): each transformer layer through torch.compile.

The compiled model must compute what the eager one does: on CPU (inductor's C++ kernels), the
loss and every parameter's gradient of the tiny model over a split batch, within fp32
rounding; the state dict is the same (checkpoints do not see the compilation).
"""
from __future__ import annotations

import pytest
import torch
from compile_watch import fresh_dynamo  # noqa: F401 (fixture)
from model_fixtures import build_model, init_megatron, mean_masked_loss, random_batch, tiny_config

from megatron_biglm.common.config_fields import ConfigError
from megatron_biglm.model.biglm_model import compile_layers_on


def test_compile_layers_setting_resolves_and_bad_values_are_refused():
    assert compile_layers_on(True) and not compile_layers_on(False)
    assert compile_layers_on("auto") == torch.cuda.is_available()
    with pytest.raises(ConfigError, match="model.compile_layers.*got 'sometimes'"):
        tiny_config(compile_layers="sometimes")


@pytest.mark.slow
def test_compiled_layers_equal_eager_loss_and_gradients(fresh_dynamo):  # noqa: F811
    init_megatron(1, 1)
    batch = random_batch(tiny_config(), 2, 24, seed=5)
    batch["split"] = torch.tensor([0, 11])
    results = {}
    for compiled in (False, True):
        model = build_model(tiny_config(compile_layers=compiled), seed=3)
        assert all(hasattr(layer, "_compiled_call_impl") and (layer._compiled_call_impl is not None) == compiled
                   for layer in model.decoder.layers)
        loss = mean_masked_loss(model, batch)
        loss.backward()
        results[compiled] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                             if p.grad is not None}, set(model.state_dict()))
    (loss_e, grads_e, keys_e), (loss_c, grads_c, keys_c) = results[False], results[True]
    assert keys_e == keys_c
    torch.testing.assert_close(loss_c, loss_e, atol=1e-5, rtol=1e-5)
    assert grads_e.keys() == grads_c.keys()
    for name in grads_e:
        torch.testing.assert_close(grads_c[name], grads_e[name], atol=1e-4, rtol=1e-4, msg=lambda m: f"{name}: {m}")
