"""Zero-shot evaluation during training, configured by `zero_shot_eval:`: a short tiny run
logs the scores to metrics.jsonl at exactly the configured steps, and leaves the training
trajectory as it is without them."""
from __future__ import annotations

import pytest

from eval_fixtures import write_task_data
from megatron_biglm.cli.train import train
from megatron_biglm.config import ConfigError, load_config
from megatron_biglm.training.metrics import read_metrics
from train_fixtures import loss_and_grad_norm, tiny_overrides, train_data  # noqa: F401 (fixture)

TASKS = ("arc_easy", "piqa")
LIMIT = 2


def test_short_run_logs_zero_shot_scores_at_the_configured_steps(train_data, tmp_path):
    data_dir = write_task_data(tmp_path / "tasks", TASKS, n=3)
    plain = tiny_overrides(train_data, tmp_path / "plain", steps=5)
    scored = tiny_overrides(train_data, tmp_path / "scored", steps=5, **{
        "zero_shot_eval.enabled": True, "zero_shot_eval.every_n_steps": 2,
        "zero_shot_eval.tasks": f"[{','.join(TASKS)}]", "zero_shot_eval.limit": LIMIT,
        "zero_shot_eval.data_dir": str(data_dir), "zero_shot_eval.batch_size": 4})
    train(None, plain)
    train(None, scored)
    records = [r for r in read_metrics(tmp_path / "scored" / "metrics.jsonl") if r.get("kind") == "zero_shot"]
    assert [r["step"] for r in records] == [2, 4]
    for r in records:
        scores = {k: v for k, v in r.items() if k.startswith("zero_shot/")}
        assert set(scores) == {"zero_shot/arc_easy/acc", "zero_shot/piqa/acc_norm", "zero_shot/avg"}
        for key in ("zero_shot/arc_easy/acc", "zero_shot/piqa/acc_norm"):
            assert scores[key] * LIMIT in range(LIMIT + 1)  # a share of LIMIT documents
        assert scores["zero_shot/avg"] == pytest.approx(
            (scores["zero_shot/arc_easy/acc"] + scores["zero_shot/piqa/acc_norm"]) / 2)
    # scoring between steps does not move training: loss and grad norm bit for bit
    assert loss_and_grad_norm(tmp_path / "scored") == loss_and_grad_norm(tmp_path / "plain")


def test_zero_shot_config_is_checked_at_load():
    with pytest.raises(ConfigError, match="unknown config key 'zero_shot_eval.every'"):
        load_config(None, ["zero_shot_eval.every=10"])
    with pytest.raises(ConfigError, match="every_n_steps must be >= 1"):
        load_config(None, ["zero_shot_eval.enabled=true", "zero_shot_eval.every_n_steps=0"])
    with pytest.raises(ConfigError, match="pipeline_model_parallel_size=1"):
        load_config(None, ["zero_shot_eval.enabled=true", "parallelism.pipeline_model_parallel_size=2"])
    cfg = load_config(None, ["zero_shot_eval.enabled=true", "zero_shot_eval.tasks=[arc_easy]"])
    assert cfg.zero_shot_eval.tasks == ["arc_easy"] and cfg.zero_shot_eval.every_n_steps == 1000
