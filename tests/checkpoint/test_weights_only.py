"""The weights-only load fills a freshly built model with exactly the stored weights: every
tensor of the model, those DCP reads straight into the model's own memory and those it hands
back as new tensors (the fused GLU halves), equals the checkpoint's, read independently
through DCP, bit for bit."""
from __future__ import annotations

import re

import pytest
import torch

from checkpoint_damage import own_process_group, saved_run, train_data  # noqa: F401  (fixtures)

pytestmark = pytest.mark.usefixtures("own_process_group")


def _stored_name(sharded: dict):
    """The model tensor's name in the checkpoint (its sharded key; a layer's: with its index)."""
    def name(local: str) -> str:
        key, layer = sharded[local].key, re.match(r"decoder\.layers\.(\d+)\.", local)
        return f"decoder.layers.{layer.group(1)}.{key.removeprefix('decoder.layers.')}" if layer else key
    return name


def test_loaded_weights_equal_the_stored_ones_bit_for_bit(saved_run):  # noqa: F811
    from convert_fixtures import build_megatron_model
    from megatron_biglm.checkpoint.weights_only import load_model_weights
    from megatron_biglm.config.trained_checkpoint import open_checkpoint
    from megatron_biglm.model.standalone import init_single_process

    checkpoint = open_checkpoint(saved_run[0] / "iter_0000004")
    init_single_process(tp=1, pp=1)
    model = build_megatron_model(checkpoint.model_config)
    fresh = {k: v.clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    load_model_weights(checkpoint.path, model)
    stored, keys = checkpoint.weights(), model.sharded_state_dict()
    loaded = {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    assert sorted(map(_stored_name(keys), loaded)) == sorted(stored)
    for name, tensor in loaded.items():
        assert torch.equal(tensor, stored[_stored_name(keys)(name)]), name
    # trained for 4 steps: the load replaced the fresh initialisation, the GLU weights included
    changed = [name for name in loaded if not torch.equal(loaded[name], fresh[name])]
    assert any("linear_fc1" in name for name in changed) and len(changed) > len(loaded) // 2
