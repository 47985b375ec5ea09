"""The reported loss survives megatron's schedule: it divides the loss tensor a loss function
returns *in place* (by the token count and the number of micro-batches, unless
calculate_per_token_loss), so a report that aliased it would come out scaled down.

A tiny module stands in for BiGLM (per-token losses from its own weight, the model's output
contract), driven through step.forward_backward, i.e. megatron's real schedule, and the
reported mean is checked against a direct per-token mean over many random batches."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from megatron_biglm.model.loss import masked_lm_loss_func
from megatron_biglm.config import load_config


class PerTokenLoss(torch.nn.Module):
    """Returns [b, s] per-token losses (0 where not predicted), like BiGLMModel with labels."""

    def __init__(self, config):
        from megatron.core.enums import ModelType

        super().__init__()
        self.config, self.model_type = config, ModelType.encoder_or_decoder
        self.scale = torch.nn.Parameter(torch.tensor(0.5))

    def set_input_tensor(self, tensor):  # pipeline hook: one stage, nothing comes in
        assert tensor is None or tensor == [None]

    def forward(self, tokens, split=None, labels=None, loss_mask=None, predicted_rows=None):  # noqa: ARG002
        return (tokens.float() * 0.01 + labels.float() * 0.001) * self.scale * (loss_mask != 0)


@pytest.fixture
def world1():
    from megatron_biglm.training import distributed

    cfg = load_config(None, [])
    info = distributed.init_distributed(cfg.parallelism, cfg.training.seed)
    yield info
    distributed.shutdown(info)


def _batches(rng, n, mbs=3, seq=16):
    out = []
    for _ in range(n):
        mask = (rng.random((mbs, seq)) < 0.3).astype(np.float32)
        mask[:, 0] = 1.0  # at least one predicted token per row
        out.append({"tokens": torch.from_numpy(rng.integers(0, 1000, (mbs, seq))),
                    "labels": torch.from_numpy(rng.integers(0, 1000, (mbs, seq))),
                    "loss_mask": torch.from_numpy(mask), "split": torch.zeros(mbs, dtype=torch.int64)})
    return out


@pytest.mark.parametrize("per_token", [True, False], ids=["per_token_loss", "per_microbatch_loss"])
@pytest.mark.parametrize("forward_only", [True, False], ids=["eval", "train"])
def test_reported_loss_is_the_per_token_mean_whatever_the_schedule_divides(world1, per_token, forward_only):
    from megatron.core.transformer import TransformerConfig

    from megatron_biglm.training.pretrain_recipe import PretrainRecipe
    from megatron_biglm.training.recipe import split_report
    from megatron_biglm.training.step import forward_backward, make_forward_step, reduce_reports

    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1,
                               calculate_per_token_loss=per_token, use_cpu_initialization=True)
    model = PerTokenLoss(config)
    rng = np.random.default_rng(0)
    for num_micro in (1, 2, 5):
        batches = _batches(rng, num_micro)
        with torch.no_grad():
            direct = [model(b["tokens"], labels=b["labels"], loss_mask=b["loss_mask"]) for b in batches]
        expected_sum = sum(float(d.double().sum()) for d in direct)
        expected_count = sum(int((b["loss_mask"] != 0).sum()) for b in batches)
        forward_step = make_forward_step(torch.device("cpu"), PretrainRecipe())
        losses = forward_backward([model], iter(batches), num_micro, 16, 3, forward_step, forward_only=forward_only)
        loss, count, _ = split_report(reduce_reports(losses, torch.device("cpu")), None)
        assert count == expected_count
        assert loss == pytest.approx(expected_sum / expected_count, rel=1e-6)


def test_loss_func_report_does_not_alias_the_returned_loss():
    rng = np.random.default_rng(1)
    for _ in range(20):
        output = torch.from_numpy(rng.random((2, 9)).astype(np.float32))
        mask = torch.from_numpy((rng.random((2, 9)) < 0.5).astype(np.float32))
        loss, n, parts = masked_lm_loss_func(mask, output)
        report = parts["lm loss"].clone()
        loss /= torch.clamp(n, min=1)  # what megatron's schedule does to it
        loss /= 3
        assert torch.equal(parts["lm loss"], report)
        assert report.tolist() == pytest.approx([float((output * mask).sum()), float((mask != 0).sum())])
