"""The kernel report (model/kernels.py): what the configured attention backend resolves to on
this machine, megatron's Adam, the optional kernel packages and the versions, printed by the
training entry and by `training.cli_kernels` (which launch/common.sh runs); a config naming a
kernel that is not installed is refused with the package to pip install."""
from __future__ import annotations

import platform

import pytest
import torch

from megatron_biglm.config import ConfigError
from megatron_biglm.model.attention_params import flash_attn_available
from megatron_biglm.model.kernels import check_kernel, kernel_report
from train_fixtures import tiny_overrides, train_data  # noqa: F401 (fixture)

no_flash = pytest.mark.skipif(flash_attn_available(), reason="flash-attn and CUDA are present here")


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto resolves to sdpa only without CUDA")
def test_kernels_report_names_the_resolved_backend():
    report = kernel_report("auto", torch.float32)
    assert report.resolved == "sdpa"
    text = str(report)
    assert "kernels: attention sdpa (model.attention_backend=auto)" in text
    assert "scaled_dot_product_attention" in text
    assert f"python {platform.python_version()}" in text
    assert f"torch {torch.__version__}" in text
    for name in ("megatron-core", "transformers", "flash-attn", "transformer-engine"):
        assert name in text
    if not any(report.packages[k] for k in ("transformer-engine", "apex")):
        assert "torch.optim" in report.adam  # megatron-core falls back to torch's Adam


def test_kernels_report_of_explicit_backends():
    assert kernel_report("sdpa", torch.bfloat16).resolved == "sdpa"
    assert "unfused" in kernel_report("local", torch.float32).attention
    flex = kernel_report("flex", torch.float32)
    assert flex.resolved == "flex" and ("compiled" if torch.cuda.is_available() else "eager") in flex.attention
    assert "compiled" in kernel_report("flex", torch.float32, attention_compile=True).attention
    assert "eager" in kernel_report("flex", torch.float32, attention_compile=False).attention


@no_flash
def test_kernels_refuse_flash_without_flash_attn():
    with pytest.raises(ConfigError, match=r"needs the flash-attn package.*pip install flash-attn"):
        check_kernel("flash", torch.bfloat16)


def test_kernels_refuse_what_the_backend_cannot_do():
    with pytest.raises(ConfigError, match="no attention dropout"):
        check_kernel("flex", torch.float32, attention_dropout=0.1)
    if flash_attn_available():
        with pytest.raises(ConfigError, match="fp16/bf16 only"):
            check_kernel("flash", torch.float32)


@no_flash
def test_kernels_train_refuses_flash_before_reading_data(tmp_path, capsys):
    from megatron_biglm.cli.train import main

    config = tmp_path / "run.yaml"  # no data configured: the refusal comes before data is read
    config.write_text("model:\n  preset: tiny\n")
    code = main(["--config", str(config), f"run_dir={tmp_path / 'run'}", "model.attention_backend=flash"])
    assert code == 2
    assert "pip install flash-attn" in capsys.readouterr().err


def test_kernels_cli_prints_the_report(tmp_path, capsys):
    from megatron_biglm.cli.kernels import main

    config = tmp_path / "run.yaml"
    config.write_text("model:\n  preset: tiny\n  attention_backend: sdpa\ntraining:\n  precision: fp32\n")
    assert main(["--config", str(config)]) == 0
    assert "kernels: attention sdpa (model.attention_backend=sdpa)" in capsys.readouterr().out
    if not flash_attn_available():
        assert main(["--config", str(config), "model.attention_backend=flash"]) == 2
        assert "pip install flash-attn" in capsys.readouterr().err


def test_kernels_report_printed_at_training_start(train_data, tmp_path, capsys):  # noqa: F811
    from megatron_biglm.cli.train import train

    train(None, tiny_overrides(train_data, tmp_path / "run", steps=5, **{"model.attention_backend": "sdpa"}))
    out = capsys.readouterr().out
    assert "kernels: attention sdpa (model.attention_backend=sdpa)" in out
    assert "versions: python" in out
