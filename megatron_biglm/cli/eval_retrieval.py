"""`python -m megatron_biglm.cli.eval_retrieval`: nDCG@10 / Recall@100 / MRR@10 of a model on BEIR-format folders.

    python -m megatron_biglm.cli.eval_retrieval --model DIR --data BEIR_DIR [BEIR_DIR ...] --output results.json [--split test]

--model: a sentence-transformers directory (`python -m megatron_biglm.cli.convert to-st`) or one of our
checkpoints. Prints one row per data set and their average (as the paper's Table 3) and
writes {"datasets": {NAME: {"ndcg@10", "recall@100", "mrr@10", counts...}}, "average": {...}}.
Exit 1 on a bad input (the message says what to fix).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from megatron_biglm.cli import refuse
from megatron_biglm.finetune.retrieval.beir import METRICS, BeirFormatError, evaluate_beir


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m megatron_biglm.cli.eval_retrieval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="sentence-transformers dir or megatron-biglm checkpoint")
    p.add_argument("--data", required=True, nargs="+", help="BEIR-format folders (NAME = folder name)")
    p.add_argument("--output", help="results JSON")
    p.add_argument("--split", default="test", help="qrels/<split>.tsv (default test)")
    p.add_argument("--batch-size", type=_positive_int, default=32, help="texts encoded at once (>= 1)")
    p.add_argument("--cache-dir", default=str(Path("~/.cache/biglm_retrieval").expanduser()),
                   help="corpus-embedding cache ('' disables)")
    p.add_argument("--pooling", default="mean", help="for a megatron checkpoint: mean|cls|last")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--skip-unknown-documents", action="store_true",
                   help="leave out (and count) qrels rows naming documents the corpus lacks, instead of failing")
    p.add_argument("--keep-first-duplicate", action="store_true",
                   help="keep the first row of an _id repeated in corpus.jsonl or queries.jsonl (the later ones "
                        "counted), instead of failing")
    return p


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def format_table(results: dict) -> str:
    rows = [("dataset", *METRICS, "queries", "skipped")]
    for name, r in results["datasets"].items():
        if "error" in r:
            rows.append((name, *("-" for _ in METRICS), "error", ""))
            continue
        rows.append((name, *(f"{100 * r[m]:.2f}" for m in METRICS), str(r["queries"]), str(r["skipped_queries"])))
    if results["average"]:
        rows.append(("average", *(f"{100 * results['average'][m]:.2f}" for m in METRICS), "", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows)


def evaluate(encoder, folders, *, split="test", cache_dir=None, batch_size=32, progress=True,
             unknown_documents="error", duplicate_ids="error", output=None) -> dict:
    """Every folder in turn; a folder that fails is recorded with its error and the others go
    on. With `output`, the results so far are written after each folder."""
    names = [Path(folder).resolve().name for folder in folders]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise BeirFormatError(f"two data folders are named {repeated[0]!r}: results are keyed by folder name")
    results: dict = {"datasets": {}, "average": {}}
    for name, folder in zip(names, folders):
        try:
            results["datasets"][name] = evaluate_beir(encoder, folder, split=split, cache_dir=cache_dir,
                                                      batch_size=batch_size, progress=progress,
                                                      unknown_documents=unknown_documents,
                                                      duplicate_ids=duplicate_ids)
        except BeirFormatError as exc:
            results["datasets"][name] = {"error": str(exc)}
        done = [r for r in results["datasets"].values() if "error" not in r]
        results["average"] = {m: sum(r[m] for r in done) / len(done) for m in METRICS} if done else {}
        if output:
            Path(output).write_text(json.dumps(results, indent=2) + "\n")
    return results


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from megatron_biglm.finetune.retrieval.encoders import load_encoder

    if not Path(args.model).expanduser().exists():
        print(f"error: --model {args.model} does not exist; pass a sentence-transformers directory "
              "(python -m megatron_biglm.cli.convert to-st) or a megatron-biglm checkpoint", file=sys.stderr)
        return 1
    try:
        encoder = load_encoder(args.model, pooling=args.pooling)
        results = evaluate(encoder, args.data, split=args.split, cache_dir=args.cache_dir or None,
                           batch_size=args.batch_size, progress=not args.quiet, output=args.output,
                           unknown_documents="skip" if args.skip_unknown_documents else "error",
                           duplicate_ids="keep_first" if args.keep_first_duplicate else "error")
    except (BeirFormatError, FileNotFoundError) as exc:
        return refuse(exc, 1)
    print(format_table(results), flush=True)
    for name, result in results["datasets"].items():
        for note in result.get("notes", []):  # what was skipped, and why
            print(f"note: {name}: {note}", file=sys.stderr)
    failed = {n: r["error"] for n, r in results["datasets"].items() if "error" in r}
    for name, error in failed.items():
        print(f"error: {name}: {error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
