"""Tokenize jsonl / text / parquet corpora into Megatron indexed datasets.

    python -m megatron_biglm.cli.preprocess --input 'data/*.jsonl.zst' --output-prefix out/corpus \\
        --tokenizer DIR_OR_NAME --json-keys text --workers 8 --append-eod

Writes OUT_{key}_document.{bin,idx} and prints a summary whose last line is one JSON
object (documents, tokens, skipped: reason -> count, ...). Exit status: 0 done (even with
skipped inputs), 1 fatal (bad input under --strict, no input files, nothing readable),
2 usage error.
"""
from __future__ import annotations

import argparse
import sys

from megatron_biglm.cli import command_logging


def parse_args(argv):
    from megatron_biglm.data.preprocess import DEFAULT_BATCH_SIZE

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", required=True,
                        help="files, globs or directories (.jsonl/.txt/.parquet, + .gz/.zst)")
    parser.add_argument("--output-prefix", required=True)
    parser.add_argument("--tokenizer", "--tokenizer-model", dest="tokenizer", required=True,
                        help="tokenizer directory (ours or any HF one), or a hub name")
    parser.add_argument("--json-keys", nargs="+", default=["text"],
                        help="jsonl keys / parquet columns; one output dataset per key")
    parser.add_argument("--workers", type=int, default=1, help="tokenizer processes")
    parser.add_argument("--append-eod", action="store_true", help="append EOS to each document")
    parser.add_argument("--strict", action="store_true", help="any bad input is fatal")
    parser.add_argument("--text-mode", choices=("block", "file"), default="block",
                        help="plain text: a document per blank-line-separated block, or per file")
    parser.add_argument("--input-format", choices=("auto", "jsonl", "text", "parquet"),
                        default="auto", help="default: from each file's suffix")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                        help="documents per tokenizer batch")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    command_logging()
    from megatron_biglm.data.indexed_tools import CorruptDatasetError
    from megatron_biglm.data.preprocess import PreprocessError, format_summary, preprocess
    from megatron_biglm.data.readers import BadInputError
    from megatron_biglm.data.tokenizer import TokenizerLoadError

    try:
        summary = preprocess(args.input, args.output_prefix, args.tokenizer,
                             json_keys=args.json_keys, workers=args.workers,
                             append_eod=args.append_eod, strict=args.strict,
                             batch_size=args.batch_size, text_mode=args.text_mode,
                             input_format=args.input_format, progress=not args.quiet)
    except (BadInputError, PreprocessError, TokenizerLoadError, CorruptDatasetError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"usage error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(format_summary(summary)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
