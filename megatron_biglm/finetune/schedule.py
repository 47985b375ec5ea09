"""A fine-tune's schedule in its run config: the sections its epochs decide, by the one rule of
`epochs.py`, once the encoded training set says how many examples there are.

    schedule.train_steps  = max(epochs * steps_per_epoch, min_steps)
    schedule.warmup_steps = round(warmup_fraction * train_steps)   (at most train_steps - 1)
    data.seq_length       = finetune.max_length
    a checkpoint at every task validation (`validation_interval`), and at the end

A fine-tune is validated by its task's metrics (`validation.TaskValidator`), not by a
validation-loss pass, so `training.eval_interval` is 0.
"""
from __future__ import annotations

import dataclasses

from megatron_biglm.config import RunConfig, derive

from .epochs import steps_per_epoch, train_steps


def validation_interval(n_train: int, options, global_batch_size: int) -> int:
    """Steps between task validations (and checkpoints): every epoch, unless `min_steps`
    stretched the run (an "epoch" of a few examples is a step or two, and a validation and
    checkpoint per step is no schedule): then once, at the end. `validate_every_steps` wins."""
    steps = train_steps(n_train, options.epochs, global_batch_size, options.min_steps)
    stretched = steps > train_steps(n_train, options.epochs, global_batch_size)
    return options.validate_every_steps or (steps if stretched else steps_per_epoch(n_train, global_batch_size))


def derived_schedule(cfg: RunConfig, n_train: int) -> RunConfig:
    """`cfg` with the sections its `finetune:` epochs decide for `n_train` training examples
    (through `derive`, checked once)."""
    options, gbs = cfg.finetune, cfg.training.global_batch_size
    steps = train_steps(n_train, options.epochs, gbs, options.min_steps)
    warmup = round(options.warmup_fraction * steps)
    return derive(
        cfg, data=dataclasses.replace(cfg.data, seq_length=options.max_length),
        schedule=dataclasses.replace(cfg.schedule, style=options.schedule, train_steps=steps,
                                     warmup_steps=min(warmup, steps - 1)),
        training=dataclasses.replace(cfg.training, eval_interval=0, eval_iters=0),
        checkpoint=dataclasses.replace(cfg.checkpoint, save_interval=validation_interval(n_train, options, gbs),
                                       save_at_end=True))
