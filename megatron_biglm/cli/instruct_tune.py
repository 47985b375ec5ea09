"""Instruction-tune a model (“Scaling Effects of Instruction Tuning” §3.1): an alias of the fine-tuning entry for the
`instruct` task kind.

    python -m megatron_biglm.cli.instruct_tune --config examples/configs/instruct/scaling_effects.yaml \
        --data data/instruct [--valid-data data/instruct_valid] [--epochs 1] [key=value ...]

is `python -m megatron_biglm.cli.finetune` with `finetune.task={kind: instruct}`,
`finetune.data.train=DATA` (and `validation=VALID`), `finetune.epochs=EPOCHS`, and the config's
own sequence length, schedule style and warmup. `--data` is a dataset written by
`python -m megatron_biglm.cli.instruct_data build`; the epochs become steps by the one rule of
every fine-tune (`finetune/epochs.py`); `finetune.init_from=CKPT` starts from pretrained weights.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from megatron_biglm.cli import print_result, refuse


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--data", required=True, help="a dataset written by `cli.instruct_data build`")
    parser.add_argument("--valid-data", default=None, help="a held-out dataset: validated by its masked loss")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides")
    args = parser.parse_args(argv)

    from megatron_biglm.checkpoint.dirs import CheckpointError
    from megatron_biglm.common.disk import DiskError
    from megatron_biglm.common.hub import HubUnavailable
    from megatron_biglm.config import ConfigError

    try:
        result = _instruct_tune(args)
    except (ConfigError, CheckpointError, HubUnavailable, DiskError) as exc:
        return refuse(exc, 2)
    print_result(json.dumps({"result": result["train"]}))
    return 0


def _instruct_tune(args) -> dict:
    """The config loaded once; the `finetune:` settings the flags and the config's own schedule
    decide are set on its typed section, except those the command line's overrides name."""
    from megatron_biglm.config import derive, load_config, parse_override
    from megatron_biglm.finetune.epochs import train_steps
    from megatron_biglm.finetune.instruct import InstructionData
    from megatron_biglm.run import finetune

    cfg = load_config(args.config, list(args.overrides))
    steps = train_steps(len(InstructionData.load(args.data)), args.epochs, cfg.training.global_batch_size)
    named = {".".join(parse_override(text)[0]) for text in args.overrides}
    data = {"train": args.data, **({"validation": args.valid_data} if args.valid_data else {})}
    data = {**cfg.finetune.data, **{k: v for k, v in data.items() if f"finetune.data.{k}" not in named}}
    settings = {"task": {"kind": "instruct", "eval_splits": ["validation"] if args.valid_data else []},
                "data": data, "epochs": args.epochs, "max_length": cfg.data.seq_length,
                "schedule": cfg.schedule.style,
                "warmup_fraction": min(cfg.schedule.warmup_steps, steps - 1) / steps}
    settings = {k: v for k, v in settings.items() if f"finetune.{k}" not in named}
    return finetune(derive(cfg, finetune=dataclasses.replace(cfg.finetune, **settings)))


if __name__ == "__main__":
    sys.exit(main())
