"""Pretrain BiGLM: `python -m megatron_biglm.cli.train --config RUN.yaml [key=value ...]`.

Also under torchrun (`torchrun --nproc-per-node N -m megatron_biglm.cli.train ...`), from SLURM
via launch/*.sh, and from Python as `train(config_or_path, overrides)`: the config is loaded
once here and run by the driver, `megatron_biglm.run.train`. See megatron_biglm/training/ for
the pieces and examples/configs/ for runs.

Where a run starts (`checkpoint.load`): `auto` resumes this run's latest checkpoint, `none`
starts fresh, a path resumes that checkpoint. A path to a weights-only checkpoint (an HF
import, `python -m megatron_biglm.cli.convert from-hf`) starts from its weights with a fresh
optimizer and schedule at step 0, until this run saves its own checkpoints: from then on
the same command resumes those (checkpoint/dirs.py choose_start).
"""
from __future__ import annotations

import sys

from megatron_biglm.cli import run_command
from megatron_biglm.run import TrainResult  # noqa: F401 - what `train` returns


def train(config_or_path, overrides=(), callbacks=(), recipe=None) -> "TrainResult":
    """The command as a function: load the config (a YAML path, a dict or None, then
    `key=value` overrides) once and run it (`megatron_biglm.run.train`)."""
    from megatron_biglm.config import load_config
    from megatron_biglm.run import train as run_train

    return run_train(load_config(config_or_path, list(overrides)), recipe=recipe, callbacks=callbacks)


def main(argv=None) -> int:
    return run_command(argv, description=__doc__, config_help="run config YAML (see examples/configs/)",
                       overrides_help="section.key=value overrides, e.g. optimizer.lr=3e-4",
                       run=train, summary=lambda result: {"result": result.__dict__})


if __name__ == "__main__":
    sys.exit(main())
