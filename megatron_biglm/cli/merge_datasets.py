"""Concatenate Megatron indexed datasets into one, or the shards of a sharded preprocessing.

    python -m megatron_biglm.cli.merge_datasets --input out/a_text_document out/b_text_document \\
        --output-prefix out/all_text_document
    python -m megatron_biglm.cli.merge_datasets --input out/shards/ --output-prefix out/all_text_document
    python -m megatron_biglm.cli.merge_datasets --shards data/shards --output-prefix data/web
    python -m megatron_biglm.cli.merge_datasets --shards data/shards --blend data/web_blend.json

Inputs are prefixes (or their .bin/.idx paths), globs, or directories (every .idx inside,
sorted by name), merged in the order given. Each input is validated first (header, version,
.idx against .bin sizes; with --tokenizer, ids against its vocabulary); a corrupt one stops
the merge with its file named.

--shards DIR takes the output of launch/preprocess.sh. Every shard manifest is checked
first (all shards of one plan present, one tokenizer and settings, outputs matching their
sha256, inputs with the sizes and mtimes their shard was made from); a missing, corrupt or
stale shard stops everything, named (--allow-stale merges stale shards as they are, and lists
them). --output-prefix PREFIX then
writes PREFIX_{key}_document.{bin,idx} per json key (the name one preprocessing process
gives, with the same bytes); --blend FILE writes a JSON blend `[[tokens, prefix], ...]` of
the shards (for data.blend), weighted by token count, instead of copying them.
Exit status: 0 done, 1 bad/corrupt input, 2 usage.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings

from megatron_biglm.cli import refuse


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", nargs="+", help="datasets to concatenate, in order")
    source.add_argument("--shards", help="a shard directory written by launch/preprocess.sh")
    parser.add_argument("--output-prefix", help="where the merged dataset goes")
    parser.add_argument("--blend", help="with --shards: write a data.blend JSON file over the shards")
    parser.add_argument("--json-key", help="with --blend: the key whose shards it lists "
                        "(default: the first key preprocessed)")
    parser.add_argument("--allow-stale", action="store_true",
                        help="with --shards: merge shards whose inputs changed since they were made (listed)")
    parser.add_argument("--tokenizer", help="the tokenizer the inputs were made with: their ids are checked "
                        "against its vocabulary")
    args = parser.parse_args(argv)
    if args.input and (args.blend or args.json_key):
        parser.error("--blend and --json-key go with --shards")
    if args.allow_stale and not args.shards:
        parser.error("--allow-stale goes with --shards")
    if args.json_key and not args.blend:
        parser.error("--json-key goes with --blend (a merge writes every key)")
    if args.input and not args.output_prefix:
        parser.error("--input needs --output-prefix")
    if args.shards and not (args.output_prefix or args.blend):
        parser.error("--shards needs --output-prefix (merge) and/or --blend (blend file)")
    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
    from megatron_biglm.data.indexed_tools import merge_datasets
    from megatron_biglm.data.shards import merge_shards, write_blend
    from megatron_biglm.data.tokenizer import TokenizerLoadError, load_tokenizer

    try:  # ShardError and CorruptDatasetError are ValueErrors
        vocab_size = len(load_tokenizer(args.tokenizer)) if args.tokenizer else None
        if args.input:
            results = {"merged": merge_datasets(args.input, args.output_prefix, vocab_size)}
        else:
            results = {}
            if args.output_prefix:
                results = merge_shards(args.shards, args.output_prefix, vocab_size, allow_stale=args.allow_stale)
            if args.blend:
                blend = write_blend(args.shards, args.blend, args.json_key, allow_stale=args.allow_stale)
    except (ValueError, TokenizerLoadError) as exc:
        return refuse(exc, 1)
    stale = next(iter(results.values()), {}).get("stale_shards") or (blend["stale_shards"] if args.blend else [])
    for why in stale:
        print(f"--allow-stale: merged the stale {why}", file=sys.stderr)
    for result in results.values():
        print(f"merged {len(result['inputs'])} datasets into {result['output']}.{{bin,idx}}: "
              f"{result['documents']:,} documents, {result['tokens']:,} tokens")
    summary = results["merged"] if args.input else {"merged": results, "blend": None}
    if args.blend:
        print(f"wrote blend {blend['blend']}: {blend['shards']} shards, {blend['tokens']:,} tokens"
              + (f" ({blend['empty_shards_left_out']} empty shards left out)"
                 if blend["empty_shards_left_out"] else ""))
        summary["blend"] = blend
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
