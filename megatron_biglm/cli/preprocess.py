"""Tokenize jsonl / text / parquet corpora into Megatron indexed datasets.

    python -m megatron_biglm.cli.preprocess --input 'data/*.jsonl.zst' --output-prefix out/corpus \\
        --tokenizer DIR_OR_NAME --json-keys text --workers 8 --append-eod

Megatron-LM's spelling works too (`tools/preprocess_data.py` in a checkout runs this command):
`--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR_OR_NAME`. Megatron's other
tokenizer types, `--vocab-file`/`--merge-file`, `--split-sentences` and `--partitions N` are
refused with what to use instead.

Writes OUT_{key}_document.{bin,idx} and prints a summary whose last line is one JSON
object (documents, tokens, skipped: reason -> count, ...). Exit status: 0 done (even with
skipped inputs), 1 fatal (bad input under --strict, no input files, nothing readable),
2 usage error.
"""
from __future__ import annotations

import argparse
import sys

from megatron_biglm.cli import command_logging, refuse
from megatron_biglm.common.config_fields import did_you_mean

HF_TOKENIZER_TYPE = "HuggingFaceTokenizer"
_CONVERT_HINT = ("save your tokenizer as an HF tokenizer directory (transformers' "
                 "`*TokenizerFast(...).save_pretrained(DIR)`, e.g. `GPT2TokenizerFast(vocab_file=..., "
                 "merges_file=...)` or `BertTokenizerFast(vocab_file=...)`) or train one with "
                 f"biglm-train-tokenizer, then pass --tokenizer-type {HF_TOKENIZER_TYPE} --tokenizer-model DIR")


def parse_args(argv):
    from megatron_biglm.data.preprocess import DEFAULT_BATCH_SIZE

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", required=True,
                        help="files, globs or directories (.jsonl/.txt/.parquet, + .gz/.zst)")
    parser.add_argument("--output-prefix", required=True)
    parser.add_argument("--tokenizer", "--tokenizer-model", dest="tokenizer",
                        help="tokenizer directory (ours or any HF one), or a hub name (required)")
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
    megatron = parser.add_argument_group("Megatron-LM's flags (refused unless noted)")
    megatron.add_argument("--tokenizer-type", help=f"accepted: {HF_TOKENIZER_TYPE} (the tokenizer is "
                          "--tokenizer-model); every other type is refused")
    for flag in ("--vocab-file", "--merge-file"):
        megatron.add_argument(flag, help="refused: give an HF tokenizer directory instead")
    megatron.add_argument("--split-sentences", action="store_true", help="refused: BiGLM reads documents")
    megatron.add_argument("--keep-newlines", action="store_true", help="refused (goes with --split-sentences)")
    megatron.add_argument("--lang", help="refused (goes with --split-sentences)")
    megatron.add_argument("--partitions", type=int, default=1,
                          help="accepted: 1; more is refused (use --workers, or biglm-preprocess-shards)")
    args = parser.parse_args(argv)
    refusal = megatron_refusal(args)
    if refusal:
        parser.error(refusal)
    if args.tokenizer is None:  # checked after the refusals, which say what to pass instead
        parser.error("the following argument is required: --tokenizer (or --tokenizer-model)")
    return args


def megatron_refusal(args) -> str | None:
    """Why a Megatron-LM flag given to this command cannot be honoured, and what to use instead;
    None when every Megatron flag given is one this command does the same way."""
    if args.tokenizer_type is not None and args.tokenizer_type != HF_TOKENIZER_TYPE:
        if args.tokenizer_type.lower() == HF_TOKENIZER_TYPE.lower():
            return f"--tokenizer-type {args.tokenizer_type}: did you mean {HF_TOKENIZER_TYPE}? (the name is case-sensitive)"
        return (f"--tokenizer-type {args.tokenizer_type} is not supported: megatron-biglm reads HF "
                f"tokenizers only{did_you_mean([args.tokenizer_type], [HF_TOKENIZER_TYPE])}; {_CONVERT_HINT}")
    given = [flag for flag, value in (("--vocab-file", args.vocab_file), ("--merge-file", args.merge_file))
             if value is not None]
    if given:
        return f"{' and '.join(given)}: Megatron's own tokenizer files are not supported; {_CONVERT_HINT}"
    sentence_flags = [flag for flag, value in (("--split-sentences", args.split_sentences),
                                               ("--keep-newlines", args.keep_newlines),
                                               ("--lang", args.lang is not None)) if value]
    if sentence_flags:
        return (f"{', '.join(sentence_flags)}: sentence splitting is not supported; BiGLM trains on "
                "whole documents (the `_document` datasets): leave the flag out")
    if args.partitions != 1:
        return (f"--partitions {args.partitions} is not supported: the output is already the same for any "
                "--workers count, so use --workers N on one node; for a corpus larger than one node use "
                "biglm-preprocess-shards (launch/preprocess.sh) and biglm-merge-datasets --shards")
    return None


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
        return refuse(exc, 1)
    except ValueError as exc:
        print(f"usage error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(format_summary(summary)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
