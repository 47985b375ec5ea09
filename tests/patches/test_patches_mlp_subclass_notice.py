"""megatron-core 0.16 logs "Unknown MLP type" once per layer for BiGLM's `MLP` subclass; the
patch drops exactly that line, and keeps it for an MLP module that is not an `MLP` subclass."""
from __future__ import annotations

import logging

import pytest
import torch
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_layer import TransformerLayerSubmodules

from megatron_biglm import patches
from megatron_biglm.patches import mlp_subclass_notice
from megatron_biglm.model.mlp import BiGLMMLP

LOGGER = logging.getLogger(mlp_subclass_notice.LOGGER)


class _NotAnMLP(torch.nn.Module):
    def __init__(self, config, submodules=None, **kwargs):  # noqa: ARG002 - built by megatron's spec
        super().__init__()


def _log_as_a_layer_would(module) -> None:
    """Log the notice from inside an `__init__` whose `submodules` hold `module` as the MLP,
    where megatron's `TransformerLayer.__init__` logs it."""

    class _Layer:
        def __init__(self, submodules):
            LOGGER.warning(f"{mlp_subclass_notice.MESSAGE}: {type(submodules.mlp)}. Using default kwargs.")

    _Layer(TransformerLayerSubmodules(mlp=ModuleSpec(module=module)))


@pytest.fixture
def fresh_logger():
    saved = list(LOGGER.filters)
    LOGGER.filters.clear()
    yield
    LOGGER.filters[:] = saved


def test_the_subclass_notice_is_dropped_and_another_mlps_is_kept(fresh_logger, caplog):
    import inspect

    import megatron.core.transformer.transformer_layer as layer

    if mlp_subclass_notice.MESSAGE not in inspect.getsource(layer):
        assert patches.apply_mlp_subclass_notice() is False  # this release does not log it: not needed
        return
    caplog.set_level(logging.WARNING, logger=mlp_subclass_notice.LOGGER)
    _log_as_a_layer_would(BiGLMMLP)
    assert mlp_subclass_notice.MESSAGE in caplog.text  # without the patch the notice shows
    caplog.clear()
    assert patches.apply_mlp_subclass_notice() is True
    assert patches.apply_mlp_subclass_notice() is True and len(LOGGER.filters) == 1  # once
    _log_as_a_layer_would(BiGLMMLP)
    assert mlp_subclass_notice.MESSAGE not in caplog.text
    _log_as_a_layer_would(_NotAnMLP)
    assert mlp_subclass_notice.MESSAGE in caplog.text


def test_building_a_biglm_model_logs_no_mlp_notice(caplog):
    from model_fixtures import build_model, init_megatron, tiny_config

    init_megatron()
    caplog.set_level(logging.WARNING)
    model = build_model(tiny_config())
    assert any(isinstance(m, BiGLMMLP) for m in model.modules())
    assert mlp_subclass_notice.MESSAGE not in caplog.text
