"""Preprocess a corpus as N shards: one array task per shard, or all of them in turn.

    python -m megatron_biglm.cli.preprocess_shards --input 'corpus/*.jsonl.zst' --tokenizer tok/ \\
        --out data/shards --shards 64 --task 7          # array task 7 of 64
    ... --task all                                      # every shard, one after another
    ... --dry-run                                       # print the plan only

`launch/preprocess.sh` runs this from a SLURM job array. Inputs are sorted and cut into
contiguous runs of whole files balanced by bytes; shard k writes
OUT/shard_{k:05d}_{key}_document.{bin,idx} and then OUT/shard_{k:05d}.manifest.json. A shard
whose manifest matches its inputs, settings and output checksums is skipped, so re-running
redoes only missing or stale shards. Merge with
`python -m megatron_biglm.cli.merge_datasets --shards OUT --output-prefix PREFIX` (or `--blend FILE`).
Exit status: 0 done, 1 fatal (bad input, a failed shard), 2 usage error.
"""
from __future__ import annotations

import argparse
import json
import sys

from megatron_biglm.cli import command_logging, refuse


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", required=True,
                        help="files, globs, directories, or @LIST (a file naming one input per line)")
    parser.add_argument("--tokenizer", help="tokenizer directory (or hub name)")
    parser.add_argument("--out", help="the shard directory")
    parser.add_argument("--shards", type=int, required=True, help="how many shards in the plan")
    parser.add_argument("--task", default=None,
                        help="the shard to make (0..SHARDS-1), or 'all' for every shard in turn")
    parser.add_argument("--dry-run", action="store_true", help="print the plan; make nothing")
    parser.add_argument("--json-keys", nargs="+", default=["text"])
    parser.add_argument("--append-eod", action=argparse.BooleanOptionalAction, default=True,
                        help="append EOS to each document (default: yes)")
    parser.add_argument("--text-mode", choices=("block", "file"), default="block")
    parser.add_argument("--input-format", choices=("auto", "jsonl", "text", "parquet"), default="auto")
    parser.add_argument("--workers", type=int, default=1, help="tokenizer processes per shard")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--strict", action="store_true", help="any bad input is fatal")
    parser.add_argument("--force", action="store_true", help="redo the shard even if up to date")
    args = parser.parse_args(argv)
    if not args.dry_run and args.task is None:
        parser.error("give --task K (0..SHARDS-1), --task all, or --dry-run")
    if not args.dry_run and not (args.tokenizer and args.out):
        parser.error("--tokenizer and --out are required (except with --dry-run)")
    if args.task not in (None, "all") and not args.task.isdigit():
        parser.error(f"--task must be a shard number or 'all', got {args.task!r}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    command_logging()
    from megatron_biglm.data.shards import ShardError, ShardSettings, plan_from_inputs

    try:
        plan = plan_from_inputs(args.input, args.shards)
    except ShardError as exc:
        return refuse(exc, 1)
    if args.dry_run:
        print("\n".join(plan.describe()), flush=True)
        return 0
    return _run(args, plan, ShardSettings(args.tokenizer, tuple(args.json_keys), args.append_eod,
                                          args.text_mode, args.input_format))


def _run(args, plan, settings) -> int:
    from megatron_biglm.data.indexed_tools import CorruptDatasetError
    from megatron_biglm.data.preprocess import PreprocessError
    from megatron_biglm.data.readers import BadInputError
    from megatron_biglm.data.shards import ShardError, run_shard
    from megatron_biglm.data.tokenizer import TokenizerLoadError, load_tokenizer

    tasks = range(plan.shards) if args.task == "all" else [int(args.task)]
    results = []
    try:
        tokenizer = load_tokenizer(args.tokenizer)
        for k in tasks:
            result = run_shard(plan, k, args.out, settings, tokenizer, workers=args.workers,
                               batch_size=args.batch_size, strict=args.strict, force=args.force)
            manifest = result["manifest"]
            skipped = manifest["skipped"]
            why = f" ({result['reason']})" if result["reason"] else ""
            print(f"shard {k}/{plan.shards}: {result['status']}{why}: {len(manifest['inputs'])} files, "
                  f"{manifest['documents']:,} documents, {manifest['tokens']:,} tokens, "
                  f"skipped {sum(skipped.values()):,}" + (f" {skipped}" if skipped else ""), flush=True)
            results.append({"shard": k, "status": result["status"], "reason": result["reason"],
                            "documents": manifest["documents"], "tokens": manifest["tokens"],
                            "skipped": skipped, "seconds": manifest["seconds"]})
    except (ShardError, BadInputError, PreprocessError, TokenizerLoadError, CorruptDatasetError) as exc:
        return refuse(exc, 1)
    except ValueError as exc:
        print(f"usage error: {exc}", file=sys.stderr)
        return 2
    done = sum(r["status"] == "done" for r in results)
    print(f"{done} shard(s) made, {len(results) - done} already up to date", flush=True)
    print(json.dumps({"shards": plan.shards, "results": results}, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
