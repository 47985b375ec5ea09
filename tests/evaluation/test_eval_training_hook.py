"""The in-training zero-shot hook: opt-in, every N steps, same numbers as a direct run."""
from __future__ import annotations

import pytest
import torch
from eval_fixtures import (one_torch_thread, tiny_bert, wordpiece_dir,  # noqa: F401
                           write_task_data)

from megatron_biglm.inference.callable_adapter import CallableMaskedLMAdapter
from megatron_biglm.inference.hf_adapter import HFMaskedLMAdapter
from megatron_biglm.evaluation.models import HFMaskedLMEvalLM
from megatron_biglm.inference import TokenIds
from megatron_biglm.evaluation.runner import score_requests
from megatron_biglm.evaluation.scoring import ScoreRequest, make_rule
from megatron_biglm.evaluation.tasks import local_task_manager, write_local_task_yamls
from megatron_biglm.evaluation.training_hook import ZeroShotHookConfig, ZeroShotTrainingHook

TASKS = ("arc_easy", "piqa")


@pytest.fixture
def tokenizer(wordpiece_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(wordpiece_dir))


class CountingModel(torch.nn.Module):
    """Wraps a masked LM and counts forward calls."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config, self.calls = inner, inner.config, 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)


def test_hook_is_off_by_default_and_runs_only_every_n_steps(tmp_path, tokenizer):
    data = write_task_data(tmp_path / "data", TASKS, n=2)
    model = CountingModel(tiny_bert(len(tokenizer), seed=1))
    off = ZeroShotTrainingHook(ZeroShotHookConfig(), tokenizer)
    assert off(1000, model) is None and model.calls == 0

    cfg = ZeroShotHookConfig.from_dict({"enabled": True, "every_n_steps": 2, "tasks": "arc_easy,piqa",
                                        "data_dir": str(data), "limit": 2})
    hook = ZeroShotTrainingHook(cfg, tokenizer, make_adapter=lambda m: HFMaskedLMAdapter(
        m.inner, TokenIds.from_tokenizer(tokenizer)))
    logged = []
    model.train()
    assert hook(1, model, log=lambda m, s: logged.append((s, m))) is None
    metrics = hook(2, model, log=lambda m, s: logged.append((s, m)))
    assert model.training  # restored after the evaluation
    assert set(metrics) == {"zero_shot/arc_easy/acc", "zero_shot/piqa/acc_norm", "zero_shot/avg"}
    assert logged == [(2, metrics)]
    assert metrics["zero_shot/avg"] == pytest.approx(
        (metrics["zero_shot/arc_easy/acc"] + metrics["zero_shot/piqa/acc_norm"]) / 2)

    # the same numbers as evaluating the model directly through lm-eval
    import lm_eval

    write_local_task_yamls(TASKS, data, tmp_path / "yaml")
    direct = lm_eval.simple_evaluate(
        model=HFMaskedLMEvalLM(pretrained=model.inner, tokenizer=tokenizer, progress=False),
        tasks=list(TASKS), task_manager=local_task_manager(tmp_path / "yaml"), limit=2)
    assert metrics["zero_shot/arc_easy/acc"] == direct["results"]["arc_easy"]["acc,none"]
    assert metrics["zero_shot/piqa/acc_norm"] == direct["results"]["piqa"]["acc_norm,none"]


def test_config_rejects_unknown_options():
    with pytest.raises(ValueError, match="unknown zero_shot_eval option"):
        ZeroShotHookConfig.from_dict({"enabled": True, "every": 10})
    with pytest.raises(ValueError, match="every_n_steps must be >= 1"):
        ZeroShotHookConfig.from_dict({"enabled": True, "every_n_steps": 0})


def test_callable_adapter_scores_like_the_hf_adapter(tokenizer):
    """A forward function taking a bool 'may attend' mask (the training loop's path)."""
    model = tiny_bert(len(tokenizer), seed=4).double()
    special = TokenIds.from_tokenizer(tokenizer)
    dtype_min = torch.finfo(torch.float64).min

    def forward(input_ids, allowed):
        additive = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, dtype_min)
        return model(input_ids=input_ids, attention_mask=additive).logits

    via_callable = CallableMaskedLMAdapter(forward, special, max_length=256)
    via_hf = HFMaskedLMAdapter(model, special)
    requests = [ScoreRequest((special.bos_id, 20, 21, 22), (30, 31)),
                ScoreRequest((special.bos_id, 20), (40, 41, 42))]
    for name in ("beam", "pll"):
        a = score_requests(via_callable, requests, make_rule(name, special.mask_id), batch_size=2)
        b = score_requests(via_hf, requests, make_rule(name, special.mask_id), batch_size=2)
        assert [r.logprob for r in a] == pytest.approx([r.logprob for r in b], abs=1e-10)
