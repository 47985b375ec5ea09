"""Attention-backend resolution considers attention dropout (flex has none).

The paper's Table 1/2/8 trial configs set `attention_dropout: 0.1`; on a GPU without
flash-attn `auto` used to pick flex, which raised at the first forward, after the datasets
were built. CUDA and flash-attn availability are faked, so this runs on CPU.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from megatron_biglm.model.attention_backends import flash as flash_backend
from megatron_biglm.model.attention_backends import resolve_backend
from megatron_biglm.model.attention_backends import varlen as varlen_backend

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"


def _fake(monkeypatch, cuda: bool, flash: bool, varlen: bool = False):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(flash_backend, "flash_attn_available", lambda: flash)
    monkeypatch.setattr(varlen_backend, "torch_varlen_available", lambda: cuda and varlen)


@pytest.mark.parametrize("cuda,flash,varlen,dropout,expected", [
    (True, False, False, 0.0, "flex"),    # GPU without flash-attn or torch varlen, no dropout: flex
    (True, False, False, 0.1, "sdpa"),    # ... with dropout: sdpa applies dropout_p
    (True, False, True, 0.0, "varlen"),   # torch's varlen attention, no dropout
    (True, False, True, 0.1, "sdpa"),     # varlen has no dropout either
    (True, True, True, 0.1, "flash"),     # flash-attn has dropout
    (True, True, False, 0.0, "flash"),
    (False, False, False, 0.1, "sdpa"),   # CPU
])
def test_auto_picks_a_backend_that_supports_the_dropout(monkeypatch, cuda, flash, varlen, dropout, expected):
    _fake(monkeypatch, cuda, flash, varlen)
    assert resolve_backend("auto", torch.bfloat16, dropout) == expected


def test_explicit_flex_with_dropout_is_refused_with_the_fix(monkeypatch):
    from megatron_biglm.model.config import ModelConfigError
    from model_fixtures import tiny_config

    _fake(monkeypatch, True, False)
    assert resolve_backend("flex", torch.bfloat16, 0.0) == "flex"
    with pytest.raises(ValueError, match="attention_backend=auto"):
        resolve_backend("flex", torch.bfloat16, 0.1)
    with pytest.raises(ModelConfigError, match="model.attention_backend=auto"):  # at config load
        tiny_config(attention_backend="flex", attention_dropout=0.1)


def test_the_trial_configs_resolve_to_sdpa_on_a_gpu_without_flash(monkeypatch):
    from megatron_biglm.config import load_config
    from megatron_biglm.model.presets import load_preset

    monkeypatch.setenv("DATA_ROOT", "/data")
    monkeypatch.setenv("BIGLM_TOKENIZER", "/tok")
    _fake(monkeypatch, True, False)
    cfg = load_config(CONFIGS / "trial_base.yaml")
    model = load_preset(cfg.model["preset"], {k: v for k, v in cfg.model.items() if k != "preset"})
    assert model.attention_dropout == 0.1 and model.attention_backend == "auto"
    assert resolve_backend(model.attention_backend, torch.bfloat16, model.attention_dropout) == "sdpa"
