"""Instruction-tune a model (seed 001 §3.1) through the one training loop:

    python -m megatron_biglm.cli.instruct_tune --config examples/configs/instruct/seed001.yaml \
        --data data/instruct [--valid-data data/instruct_valid] [--epochs 1] [key=value ...]

`--data` is a dataset written by `python -m megatron_biglm.cli.instruct_data build`. The
epochs become `schedule.train_steps` by the one rule of every fine-tune (`finetune/epochs.py`); start from pretrained weights with
`checkpoint.load=PATH` (a weights-only checkpoint, e.g. an HF import, starts fresh at step 0).
An entry point (top floor) because it wires the finetune recipe into `train`.
"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--data", required=True, help="a dataset written by `finetune.instruct build`")
    parser.add_argument("--valid-data", default=None)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides")
    args = parser.parse_args(argv)

    from megatron_biglm.config import load_config
    from megatron_biglm.finetune.epochs import steps_per_epoch, train_steps
    from megatron_biglm.finetune.instruct import InstructionData
    from megatron_biglm.finetune.recipes.instruct import InstructRecipe
    from megatron_biglm.cli.train import train

    data = InstructionData.load(args.data)
    cfg = load_config(args.config, list(args.overrides))
    steps = train_steps(len(data), args.epochs, cfg.training.global_batch_size)
    warmup = min(cfg.schedule.warmup_steps, steps - 1)
    gbs = cfg.training.global_batch_size
    print(f"{len(data)} samples / global batch {gbs} = {steps_per_epoch(len(data), gbs)} steps per epoch "
          f"(rounded up) x {args.epochs} epochs = {steps} steps",
          flush=True)
    recipe = InstructRecipe(None, None, {"data": data, "valid_data": args.valid_data})
    result = train(args.config, list(args.overrides) + [f"schedule.train_steps={steps}",
                                                         f"schedule.warmup_steps={warmup}"], recipe=recipe)
    print(json.dumps({"result": result.__dict__}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
