"""The `zero_shot_eval:` section of a run config: zero-shot accuracy during training.

Off by default. When `enabled`, every `every_n_steps` steps the live model scores `tasks`
(lm-eval names, `limit` documents each) with the masked-LM `scoring` rule, and the scores go
to metrics.jsonl as a `kind: zero_shot` record at that step (the paper's Fig. 3: ARC average
over training). `data_dir`: local task jsonl for offline machines; None loads the tasks'
data from the HF hub. The evaluation itself is evaluation/training_hook.py; run/train.py wires
it into the loop. Here only the settings, so the run config can hold them without
importing evaluation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from megatron_biglm.common.config_fields import ConfigError, build_dataclass


@dataclass
class ZeroShotEvalConfig:
    enabled: bool = False
    every_n_steps: int = 1000
    tasks: list = field(default_factory=lambda: ["arc_easy", "piqa", "sciq"])
    limit: Optional[int] = 200
    scoring: str = "beam"
    beam: int = 1
    batch_size: int = 16
    data_dir: Optional[str] = None
    metric_prefix: str = "zero_shot"

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ZeroShotEvalConfig":
        """From a plain dict (outside a run config); `tasks` may be a comma-separated string."""
        values = dict(values)
        if isinstance(values.get("tasks"), str):
            values["tasks"] = [t.strip() for t in values["tasks"].split(",") if t.strip()]
        config = build_dataclass(cls, values, "zero_shot_eval", headline="unknown zero_shot_eval option(s) {keys}")
        problem = config.problem()
        if problem:
            raise ConfigError(problem)
        return config

    def problem(self) -> str | None:
        """What is wrong with these settings, or None."""
        if self.enabled and int(self.every_n_steps) < 1:
            return f"every_n_steps must be >= 1, got {self.every_n_steps}"
        if self.enabled and not self.tasks:
            return "zero_shot_eval is enabled but names no tasks"
        return None
