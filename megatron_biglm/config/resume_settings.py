"""The settings that change a run's trajectory: a resume that changes one is another run.

One typed list, read by the run directory's claim (`run/run_claim.py`): the learning rate and
its schedule (style, warmup, floor), the optimizer's update (weight decay, clipping, betas,
epsilon) and the batch. A resume under another schedule (linear → wsd) would change the
learning rates mid-run and still be reported as one run.

`finetune.resume_changes: [KEY, ...]` names the ones a user changes on purpose; the resume goes on
with a note naming each change.
"""
from __future__ import annotations

from dataclasses import dataclass

from megatron_biglm.common.config_fields import unknown_key_error


@dataclass(frozen=True)
class TrajectorySetting:
    """One config key (`section.field`) whose value shapes every later step."""
    key: str

    def value(self, cfg):
        section, name = self.key.split(".", 1)
        return getattr(getattr(cfg, section), name)


TRAJECTORY_SETTINGS: tuple[TrajectorySetting, ...] = tuple(TrajectorySetting(k) for k in (
    "optimizer.lr", "optimizer.min_lr", "finetune.schedule", "finetune.warmup_fraction",
    "optimizer.weight_decay", "optimizer.clip_grad", "optimizer.adam_beta1", "optimizer.adam_beta2",
    "optimizer.adam_eps", "training.global_batch_size"))

KEYS = tuple(s.key for s in TRAJECTORY_SETTINGS)


def trajectory(cfg) -> dict:
    """{key: value} of every trajectory setting of `cfg`."""
    return {s.key: s.value(cfg) for s in TRAJECTORY_SETTINGS}


def allowed_changes(cfg) -> tuple[str, ...]:
    """The trajectory settings `finetune.resume_changes` lets a resume change; an unknown key
    is refused with the list."""
    named = tuple(cfg.finetune.resume_changes)
    unknown = [k for k in named if k not in KEYS]
    if unknown:
        raise unknown_key_error("finetune.resume_changes", unknown, list(KEYS),
                                headline="finetune.resume_changes names {keys}, not a trajectory setting")
    return named


__all__ = ["KEYS", "TRAJECTORY_SETTINGS", "TrajectorySetting", "allowed_changes", "trajectory"]
