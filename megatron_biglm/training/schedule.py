"""Learning-rate schedules on megatron-core's `OptimizerParamScheduler`.

Convention: the scheduler counts optimizer steps (not samples, unlike Megatron-LM's
training script), and the loop advances it *before* each step, so step i (1-based) runs
at lr(i): the first step has a non-zero warmup lr and the last step of a WSD run runs at
exactly `min_lr`. WSD here is the paper's: warmup, constant `lr`, then a linear decay
over the last `decay_steps` steps to `min_lr` (§3.2, Table 7: 60k of 300k).
"""
from __future__ import annotations

from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from megatron_biglm.config import OptimizerConfig, ScheduleConfig

_STYLES = {"wsd": "WSD", "cosine": "cosine", "linear": "linear", "constant": "constant"}


def build_scheduler(optimizer, s: ScheduleConfig, o: OptimizerConfig) -> OptimizerParamScheduler:
    """The scheduler over `optimizer` (anything with `param_groups`) that the run config's
    `schedule:` and `optimizer:` sections (its lr, min_lr and weight decay) describe."""
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=o.lr,
        min_lr=o.min_lr,
        lr_warmup_steps=s.warmup_steps,
        lr_decay_steps=s.train_steps,
        lr_decay_style=_STYLES[s.style],
        start_wd=o.weight_decay,
        end_wd=o.weight_decay,
        wd_incr_steps=s.train_steps,
        wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=False,
        override_opt_param_scheduler=False,
        wsd_decay_steps=s.wsd_decay_steps if s.style == "wsd" else None,
        lr_wsd_decay_style=s.wsd_decay_style if s.style == "wsd" else None,
    )


def lr_curve(schedule: ScheduleConfig, optimizer: OptimizerConfig) -> list[float]:
    """lr at steps 1..train_steps, computed by the same scheduler the loop uses."""

    class _Groups:
        param_groups = [{}]

    sched = build_scheduler(_Groups(), schedule, optimizer)
    out = []
    for _ in range(schedule.train_steps):
        sched.step(1)
        out.append(_Groups.param_groups[0]["lr"])
    return out


def resume_scheduler(scheduler: OptimizerParamScheduler, num_steps: int) -> None:
    """Advance a fresh scheduler to a checkpoint's step count. Only the count is restored:
    the schedule's shape (lr, warmup, decay) comes from this run's config, so a resumed run
    may change it."""
    scheduler.num_steps = 0
    scheduler.step(int(num_steps))
