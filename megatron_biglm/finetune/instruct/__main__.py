"""Instruction data and instruction tuning from the command line.

    # FLAN / xP3 jsonl -> tokenized dataset (English, targets of at most 3 tokens: seed 001)
    python -m megatron_biglm.finetune.instruct build --input 'xp3/*.jsonl' --tokenizer TOK \
        --out data/instruct --max-length 256 --max-target-tokens 3 --language en

    # instruction-tune (the epochs become schedule.train_steps)
    python -m megatron_biglm.finetune.instruct train --config examples/configs/instruct/seed001.yaml \
        --data data/instruct --epochs 1 [key=value ...]
"""
from __future__ import annotations

import argparse
import json
import math
import sys


def _build(args) -> int:
    from megatron_biglm.data.tokenizer import load_tokenizer

    from .dataset import build_instruction_data

    template = json.loads(args.template) if args.template.strip().startswith("{") else args.template
    data, report = build_instruction_data(args.input, load_tokenizer(args.tokenizer), template=template,
                                          max_length=args.max_length, max_target_tokens=args.max_target_tokens,
                                          languages=args.language or None, strict=args.strict)
    data.meta["tokenizer"] = args.tokenizer
    data.save(args.out)
    print(f"wrote {len(data)} samples ({len(data.tokens)} tokens) to {args.out}; {report.summary_line()}")
    for line in report.example_lines():
        print("  " + line)
    return 0


def steps_for_epochs(samples: int, epochs: float, global_batch_size: int) -> int:
    """ceil(epochs × samples / global batch): the last step tops up from the next epoch's order."""
    return max(1, math.ceil(epochs * samples / global_batch_size))


def _train(args) -> int:
    from megatron_biglm.config import load_config
    from megatron_biglm.train import train

    from ..recipes.instruct import InstructRecipe
    from .dataset import InstructionData

    data = InstructionData.load(args.data)
    cfg = load_config(args.config, list(args.overrides))
    steps = steps_for_epochs(len(data), args.epochs, cfg.training.global_batch_size)
    warmup = min(cfg.schedule.warmup_steps, steps - 1)
    overrides = list(args.overrides) + [f"schedule.train_steps={steps}", f"schedule.warmup_steps={warmup}"]
    recipe = InstructRecipe(None, None, {"data": args.data, "valid_data": args.valid_data})
    print(f"{len(data)} samples x {args.epochs} epochs / batch {cfg.training.global_batch_size} = {steps} steps",
          flush=True)
    result = train(args.config, overrides, recipe=recipe)
    print(json.dumps({"result": result.__dict__}), flush=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="jsonl/parquet rows -> tokenized instruction dataset")
    b.add_argument("--input", nargs="+", required=True, help="files, globs or directories")
    b.add_argument("--tokenizer", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--template", default="default", help="a template name, or its fields as JSON")
    b.add_argument("--max-length", type=int, default=512)
    b.add_argument("--max-target-tokens", type=int, default=None, help="seed 001: 3")
    b.add_argument("--language", nargs="*", default=["en"], help="kept languages (none: no filter)")
    b.add_argument("--strict", action="store_true", help="stop at the first bad row")
    t = sub.add_parser("train", help="instruction-tune through the training loop")
    t.add_argument("--config", required=True)
    t.add_argument("--data", required=True, help="a dataset written by `build`")
    t.add_argument("--valid-data", default=None)
    t.add_argument("--epochs", type=float, default=1.0)
    t.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    return _build(args) if args.command == "build" else _train(args)


if __name__ == "__main__":
    sys.exit(main())
