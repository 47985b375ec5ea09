"""Instruction data from the command line (training: `python -m megatron_biglm.cli.instruct_tune`).

    # FLAN / xP3 jsonl -> tokenized dataset (English, targets of at most 3 tokens: “Scaling Effects of Instruction Tuning”)
    python -m megatron_biglm.cli.instruct_data build --input 'xp3/*.jsonl' --tokenizer TOK \
        --out data/instruct --max-length 256 --max-target-tokens 3 --language en
"""
from __future__ import annotations

import argparse
import json
import sys


def _build(args) -> int:
    from megatron_biglm.data.tokenizer import load_tokenizer
    from megatron_biglm.finetune.instruct.dataset import build_instruction_data

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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="jsonl/parquet rows -> tokenized instruction dataset")
    b.add_argument("--input", nargs="+", required=True, help="files, globs or directories")
    b.add_argument("--tokenizer", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--template", default="default", help="a template name, or its fields as JSON")
    b.add_argument("--max-length", type=int, default=512)
    b.add_argument("--max-target-tokens", type=int, default=None, help="“Scaling Effects of Instruction Tuning”: 3")
    b.add_argument("--language", nargs="*", default=["en"], help="kept languages (none: no filter)")
    b.add_argument("--strict", action="store_true", help="stop at the first bad row")
    args = parser.parse_args(argv)
    return _build(args)


if __name__ == "__main__":
    sys.exit(main())
