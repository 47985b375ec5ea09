"""Print a Megatron indexed dataset's statistics and decode documents.

    python -m megatron_biglm.cli.inspect_dataset out/corpus_text_document
    python -m megatron_biglm.cli.inspect_dataset out/corpus_text_document --doc 0 -1 --tokenizer tok/

Without --tokenizer, documents print as token ids. Every dataset is checked first (header,
version, .idx against .bin sizes; with --tokenizer, ids against its vocabulary). Exit status:
0 done, 1 corrupt dataset or bad document number, 2 usage error.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings

from megatron_biglm.cli import refuse


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", help="prefix, or its .bin/.idx path")
    parser.add_argument("--doc", type=int, nargs="*", default=[],
                        help="document numbers to print (negative counts from the end)")
    parser.add_argument("--tokenizer", help="tokenizer to decode with (directory or name); the data's dtype and ids "
                        "are checked against its vocabulary")
    parser.add_argument("--ids", action="store_true", help="also print the token ids")
    parser.add_argument("--json", action="store_true", help="print the statistics as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
    from megatron_biglm.data.indexed_tools import dataset_stats, read_document
    from megatron_biglm.data.tokenizer import TokenizerLoadError, load_tokenizer

    try:
        tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
        vocab_size = len(tokenizer) if tokenizer is not None else None  # checks the data's ids fit it
        stats = dataset_stats(args.dataset, vocab_size)
        if args.json:
            print(json.dumps(stats, sort_keys=True))
        else:
            lengths = stats["tokens_per_document"]
            print(f"dataset {stats['prefix']}: dtype {stats['dtype']}, "
                  f"{stats['documents']:,} documents, {stats['sequences']:,} sequences, "
                  f"{stats['tokens']:,} tokens")
            print(f"  tokens per document: min {lengths['min']:,}, mean {lengths['mean']:,}, "
                  f"median {lengths['median']:,}, max {lengths['max']:,}")
            print(f"  files: .bin {stats['bin_bytes']:,} bytes, .idx {stats['idx_bytes']:,} bytes")
        for k in args.doc:
            tokens = read_document(args.dataset, k, vocab_size)
            print(f"--- document {k} ({tokens.size:,} tokens) ---")
            if args.ids or tokenizer is None:
                print(" ".join(map(str, tokens.tolist())))
            if tokenizer is not None:
                print(tokenizer.decode(tokens.tolist()))
    except (ValueError, IndexError, TokenizerLoadError) as exc:
        return refuse(exc, 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
