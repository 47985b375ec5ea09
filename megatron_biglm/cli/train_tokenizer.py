"""Train a byte-level BPE tokenizer on jsonl / text / parquet files.

    python -m megatron_biglm.cli.train_tokenizer --input 'data/*.jsonl' --vocab-size 32000 --output tok/
    python -m megatron_biglm.cli.train_tokenizer --input 'corpus/*.jsonl.zst' --vocab-size 32000 \
        --output tok/ --sample-bytes 2000000000 --seed 1

--sample-docs N / --sample-bytes B train on a sample instead of every document: drawn in one
pass across all files, reproducible for a --seed (the same files and seed give the same
sample), the longest run of documents in the seed's draw order within the limits
(megatron_biglm/data/text_sample.py). What was sampled is printed and in the JSON line.

The output directory loads offline with `AutoTokenizer.from_pretrained(dir)` and with
`megatron_biglm.data.tokenizer.load_tokenizer`. Prints the special-token ids and the skipped
inputs; the last line is one JSON object. Exit status: 0 done, 1 fatal, 2 usage error.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys

from megatron_biglm.cli import refuse


def parse_args(argv):
    from megatron_biglm.data.tokenizer import DEFAULT_SPECIAL_TOKENS

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", required=True,
                        help="files, globs or directories (.jsonl/.txt/.parquet, + .gz/.zst)")
    parser.add_argument("--vocab-size", type=int, required=True)
    parser.add_argument("--output", required=True, help="directory to save the tokenizer in")
    parser.add_argument("--json-keys", nargs="+", default=["text"])
    parser.add_argument("--min-frequency", type=int, default=2)
    parser.add_argument("--text-mode", choices=("block", "file"), default="block")
    parser.add_argument("--strict", action="store_true", help="any bad input is fatal")
    parser.add_argument("--sample-docs", type=int, help="train on at most N sampled documents")
    parser.add_argument("--sample-bytes", type=int,
                        help="train on sampled documents of at most B bytes (UTF-8) in all")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    for role, token in DEFAULT_SPECIAL_TOKENS.items():
        parser.add_argument(f"--{role}-token", default=token, help=f"default {token}")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from megatron_biglm.data.readers import BadInputError, SkipReport
    from megatron_biglm.data.text_sample import sample_texts
    from megatron_biglm.data.tokenizer import (
        DEFAULT_SPECIAL_TOKENS,
        load_tokenizer,
        train_bpe_tokenizer,
        train_bpe_tokenizer_on_texts,
    )

    special = {role: getattr(args, f"{role}_token") for role in DEFAULT_SPECIAL_TOKENS}
    report = SkipReport(strict=args.strict)
    sample = None
    try:
        if args.sample_docs is None and args.sample_bytes is None:
            output = train_bpe_tokenizer(args.input, args.vocab_size, args.output,
                                         json_keys=args.json_keys, special_tokens=special,
                                         min_frequency=args.min_frequency,
                                         text_mode=args.text_mode, report=report)
        else:
            sample = sample_texts(args.input, max_documents=args.sample_docs,
                                  max_bytes=args.sample_bytes, seed=args.seed,
                                  json_keys=args.json_keys, report=report,
                                  text_mode=args.text_mode)
            output = train_bpe_tokenizer_on_texts(sample.texts, args.vocab_size, args.output,
                                                  special_tokens=special,
                                                  min_frequency=args.min_frequency)
    except BadInputError as exc:
        return refuse(exc, 1)
    except ValueError as exc:
        return refuse(exc, 1 if "no training text" in str(exc) or "no document fits" in str(exc) else 2)
    tokenizer = load_tokenizer(output)
    ids = {role: tokenizer.convert_tokens_to_ids(token) for role, token in special.items()}
    print(f"saved tokenizer to {output}: vocab {len(tokenizer):,}; special ids "
          + ", ".join(f"{role} {token!r}={ids[role]}" for role, token in special.items()))
    if sample is not None:
        print(f"  {sample.summary_line()}")
    print(f"  {report.summary_line()}")
    for example in report.example_lines():
        print(f"    {example}")
    print(json.dumps({"output": str(output), "vocab_size": len(tokenizer), "special_ids": ids,
                      "skipped": report.as_dict(),
                      "sample": sample.as_dict() if sample is not None else None}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
