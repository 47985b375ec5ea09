"""Sharded preprocessing (launch/preprocess.sh's path) against one process, in tokens/s.

The corpus is the embedded sample (42 Shakespeare plays), one jsonl file per play, so the
plan has real files of different sizes to balance. Both sides do the whole job and write
the same bytes (checked):
  * one process: `preprocess()` over every file, 1 worker;
  * 4 shards one after another (what `LOCAL=1 SHARDS=4` runs, without the process start):
    plan, tokenize each shard, checksum it, write its manifest, then check every manifest
    and merge. This ratio is the cost of the shard machinery (manifests, sha256, the merge
    copy) on one machine; ~1.0 is the goal.
The projected array figure divides the tokens by the slowest shard plus the merge: the wall
time when the 4 shards run on 4 nodes at once. Trials are interleaved; each figure is the
best trial (the least disturbed by other processes), the median beside it.

    python -m benchmarks preprocess_shards [--trials 3] [--shards 4]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _corpus(directory: Path) -> list[Path]:
    """One jsonl per play, one scene per line."""
    from megatron_biglm.data import sample_corpus

    files: dict[str, list[str]] = {}
    for record in sample_corpus.iter_documents():
        files.setdefault(record["source"], []).append(json.dumps({"text": record["text"]},
                                                                 ensure_ascii=False))
    directory.mkdir(parents=True, exist_ok=True)
    for source, lines in files.items():
        (directory / f"{source}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return sorted(directory.glob("*.jsonl"))


def _sharded(corpus: Path, tokenizer, tokenizer_dir, out: Path, shards: int) -> dict:
    from megatron_biglm.data.shards import (ShardSettings, merge_shards, plan_from_inputs,
                                            run_shard)

    start = time.perf_counter()
    plan = plan_from_inputs([str(corpus / "*.jsonl")], shards)
    settings = ShardSettings(str(tokenizer_dir))
    shard_seconds = []
    for k in range(shards):
        begin = time.perf_counter()
        run_shard(plan, k, out / "shards", settings, tokenizer, force=True)
        shard_seconds.append(time.perf_counter() - begin)
    begin = time.perf_counter()
    merged = merge_shards(out / "shards", str(out / "merged"))["text"]
    merge_seconds = time.perf_counter() - begin
    return {"seconds": time.perf_counter() - start, "tokens": merged["tokens"],
            "slowest_shard": max(shard_seconds), "merge": merge_seconds,
            "bytes": [plan.shard_bytes(k) for k in range(shards)]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--tokenizer", help="tokenizer dir (default: train a BPE on the corpus here)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import warnings

    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
    import megatron.core.datasets.indexed_dataset  # noqa: F401  (import cost outside timings)

    from megatron_biglm.data.preprocess import preprocess
    from megatron_biglm.data.tokenizer import load_tokenizer, train_bpe_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        files = _corpus(tmp / "corpus")
        tokenizer_dir = args.tokenizer or train_bpe_tokenizer([str(tmp / "corpus" / "*.jsonl")],
                                                              args.vocab_size, tmp / "tok")
        tokenizer = load_tokenizer(tokenizer_dir)
        load = os.getloadavg()[0]
        print(f"sharded preprocessing: {len(files)} files, "
              f"{sum(f.stat().st_size for f in files):,} bytes, vocab {len(tokenizer):,}; "
              f"{args.shards} shards vs 1 process, best of {args.trials}; {os.cpu_count()} CPUs, "
              f"load average {load:.1f} at start")
        single, sharded, projected, tokens, plan_bytes = [], [], [], None, None
        for trial in range(args.trials):
            begin = time.perf_counter()
            summary = preprocess([str(tmp / "corpus" / "*.jsonl")], str(tmp / f"single{trial}"),
                                 tokenizer)
            single.append(time.perf_counter() - begin)
            result = _sharded(tmp / "corpus", tokenizer, tokenizer_dir, tmp / f"sharded{trial}",
                              args.shards)
            sharded.append(result["seconds"])
            projected.append(result["slowest_shard"] + result["merge"])
            assert result["tokens"] == summary["tokens"]
            for suffix in ("bin", "idx"):
                assert (tmp / f"single{trial}_text_document.{suffix}").read_bytes() == \
                    (tmp / f"sharded{trial}" / f"merged_text_document.{suffix}").read_bytes()
            tokens, plan_bytes = summary["tokens"], result["bytes"]
        rate = {name: tokens / min(times) for name, times in
                (("single", single), ("sharded", sharded), ("array", projected))}
        median = {name: tokens / statistics.median(times) for name, times in
                  (("single", single), ("sharded", sharded), ("array", projected))}
        print(f"  {tokens:,} tokens; shard bytes {plan_bytes} (merged output byte-identical)")
        print(f"  1 process                          {rate['single']:>10,.0f} tokens/s "
              f"(median {median['single']:,.0f})")
        print(f"  {args.shards} shards in turn + merge          {rate['sharded']:>10,.0f} tokens/s "
              f"(median {median['sharded']:,.0f})  ratio {rate['sharded'] / rate['single']:.2f}x")
        print(f"  projected array (slowest + merge)  {rate['array']:>10,.0f} tokens/s "
              f"(median {median['array']:,.0f})  ratio {rate['array'] / rate['single']:.2f}x "
              f"(byte balance allows {sum(plan_bytes) / max(plan_bytes):.2f}x, less the merge)")
        load = os.getloadavg()[0]
        print(f"load average {load:.1f} at the end" + (
            f" (above {os.cpu_count()} CPUs: other processes shared them; the ratios are "
            "rough)" if load > (os.cpu_count() or 1) else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
