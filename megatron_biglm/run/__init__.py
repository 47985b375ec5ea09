"""The run drivers (above finetune/, below experiments/ and cli/): `train(cfg, recipe=...,
callbacks=...)`, the one loop's phases for a loaded `RunConfig`, and
`finetune(cfg)`, a task's recipe on it after `plan_finetune(cfg)` has derived the start
model's shape, the schedule and the recipe's settings as typed sections, with the run
directory's claim (`run_claim.py`) and the scoring of an untrained start (`start_scores.py`). Commands load a
config once and call these; the experiments call them directly."""
from .finetune import finetune
from .plan import FinetunePlan, plan_finetune
from .train import TrainResult, train

__all__ = ["FinetunePlan", "TrainResult", "finetune", "plan_finetune", "train"]
