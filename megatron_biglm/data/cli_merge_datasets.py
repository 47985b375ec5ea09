"""Concatenate Megatron indexed datasets into one.

    python tools/merge_datasets.py --input out/a_text_document out/b_text_document \\
        --output-prefix out/all_text_document
    python tools/merge_datasets.py --input out/shards/ --output-prefix out/all_text_document

Inputs are prefixes (or their .bin/.idx paths), globs, or directories (every .idx inside,
sorted by name), merged in the order given. Each input is validated first (header, version,
.idx against .bin sizes; with --tokenizer, ids against its vocabulary); a corrupt one stops
the merge with its file named. Exit status: 0 done, 1 bad/corrupt input, 2 usage.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", required=True)
    parser.add_argument("--output-prefix", required=True)
    parser.add_argument("--tokenizer", help="the tokenizer the inputs were made with: their ids are checked "
                        "against its vocabulary")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
    from megatron_biglm.data.indexed_tools import merge_datasets
    from megatron_biglm.data.tokenizer import TokenizerLoadError, load_tokenizer

    try:
        vocab_size = len(load_tokenizer(args.tokenizer)) if args.tokenizer else None
        result = merge_datasets(args.input, args.output_prefix, vocab_size)
    except (ValueError, TokenizerLoadError) as exc:  # includes CorruptDatasetError
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"merged {len(result['inputs'])} datasets into {result['output']}.{{bin,idx}}: "
          f"{result['documents']:,} documents, {result['tokens']:,} tokens")
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
