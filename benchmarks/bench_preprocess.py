"""Preprocessing throughput (tokens/s): `preprocess()` with 1 and 2 workers against a naive
single-process loop that calls `tokenizer(text)` once per document.

Both sides do the same whole job on the same corpus: read the jsonl, parse each line,
tokenize (+EOS), write .bin/.idx with megatron-core's IndexedDatasetBuilder. Only the
tokenizing differs: per-document HF calls, against batched single-threaded Rust calls in N
processes. Configurations are interleaved within each trial so background load hits all
of them alike; the ratios use each configuration's best trial (like `timeit`: the run least
disturbed by other processes), and the median is printed beside it. CPU seconds (this
process plus its workers, best trial) show the work done when wall-clock ratios cannot. Documents are scenes (long) and paragraphs (short, where per-call overhead
matters); the output bytes of every configuration are checked to be identical.

    python -m benchmarks preprocess [--repeat 4] [--trials 3] [--workers 1 2]

Targets: 2 workers >= 1.6x 1 worker, and >= 3x the naive loop.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _corpus(directory: Path, repeat: int, unit: str) -> Path:
    """The sample corpus as jsonl, one scene (~2.4k tokens) or one paragraph (a speech or
    stage direction, ~50 tokens) per line."""
    from megatron_biglm.data import sample_corpus

    texts = [record["text"] for record in sample_corpus.iter_documents()]
    if unit == "paragraph":
        texts = [p for text in texts for p in re.split(r"\n(?:[ \t]*\n)+", text) if p.strip()]
    path = directory / f"{unit}s.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(repeat):
            for text in texts:
                fh.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    return path


def naive_loop(path: Path, tokenizer, output_prefix: str) -> int:
    """Megatron-LM's pattern with an HF tokenizer: one `tokenizer(text)` call per document."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from megatron_biglm.data.tokenizer import dtype_for_vocab

    builder = IndexedDatasetBuilder(output_prefix + ".bin", dtype=dtype_for_vocab(len(tokenizer)))
    eos, tokens = tokenizer.eos_token_id, 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            ids = tokenizer(json.loads(line)["text"], add_special_tokens=False)["input_ids"]
            ids.append(eos)
            builder.add_document(np.asarray(ids), [len(ids)])
            tokens += len(ids)
    builder.finalize(output_prefix + ".idx")
    return tokens


def _cpu_seconds() -> float:
    """CPU time of this process plus its finished children (the tokenizer workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _measure(corpus: Path, tokenizer, tmp: Path, worker_counts, trials: int, batch_size: int):
    """(tokens, {config: [wall s per trial]}, {config: [CPU s per trial]}); configurations
    are interleaved within each trial."""
    from megatron_biglm.data.preprocess import preprocess

    names = ["naive"] + [f"w{w}" for w in worker_counts]
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    tokens = {}
    for _ in range(trials):
        for name in names:
            start, start_cpu = time.perf_counter(), _cpu_seconds()
            if name == "naive":
                tokens[name] = naive_loop(corpus, tokenizer, str(tmp / "naive"))
            else:
                tokens[name] = preprocess([corpus], tmp / name, tokenizer, workers=int(name[1:]),
                                          batch_size=batch_size)["tokens"]
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(_cpu_seconds() - start_cpu)
    assert len(set(tokens.values())) == 1, f"token counts differ: {tokens}"
    naive_bin = (tmp / "naive.bin").read_bytes()
    for name in names[1:]:  # the same bytes as the naive loop, or the speed is moot
        assert (tmp / f"{name}_text_document.bin").read_bytes() == naive_bin
    return tokens["naive"], wall, cpu


def _encode_timed(spec, texts: list[str], start_at: float) -> float:
    """In a fresh process: tokenize `texts` from `start_at` on; return the seconds taken."""
    from megatron_biglm.data import preprocess as pipeline

    pipeline._init_worker(spec)
    while time.time() < start_at:
        time.sleep(0.001)
    start = time.perf_counter()
    for i in range(0, len(texts), 128):
        pipeline._ENCODER.encode(texts[i:i + 128])
    return time.perf_counter() - start


def machine_scaling(corpus: Path, tokenizer, trials: int, repeat: int) -> float:
    """How much 2 concurrent tokenizer processes out-run 1 on this machine: the ceiling for
    '2 workers vs 1 worker' (2.0 on two idle cores; less when other processes share them or
    the virtual CPUs share a physical core). Startup is excluded: all start on a clock."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from megatron_biglm.data import preprocess as pipeline

    texts = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")]
    texts = texts[: max(1, len(texts) // repeat)]  # one copy of the sample corpus
    spec = pipeline._EncoderSpec(tokenizer.backend_tokenizer.to_str(), False,
                                 tokenizer.eos_token_id, True, "int32")
    best = {1: float("inf"), 2: float("inf")}
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=context) as pool:
        for _ in range(trials):
            for n in (1, 2):
                start_at = time.time() + 2.0  # both processes are up and idle by then
                futures = [pool.submit(_encode_timed, spec, texts, start_at) for _ in range(n)]
                best[n] = min(best[n], max(f.result() for f in futures))
    return 2 * best[1] / best[2]


def _report(unit: str, n_tokens: int, wall: dict, cpu: dict, worker_counts) -> None:
    """Best trial (least disturbed by other processes, as `timeit` does) and the median."""
    rate = {name: n_tokens / min(seconds) for name, seconds in wall.items()}
    median = {name: n_tokens / statistics.median(seconds) for name, seconds in wall.items()}
    print(f"{unit}s: {n_tokens:,} tokens")
    print(f"  {'':34}{'tokens/s':>10}  {'vs naive':>8}  {'vs 1 worker':>11}  {'median tok/s':>12}"
          f"  {'CPU s':>6}")
    labels = {"naive": "naive loop (tokenizer(text)/doc)"} | {
        f"w{w}": f"preprocess, {w} worker{'s' if w > 1 else ''}" for w in worker_counts}
    for name, label in labels.items():
        vs_one = f"{rate[name] / rate['w1']:.2f}x" if "w1" in rate and name != "naive" else ""
        print(f"  {label:34}{rate[name]:>10,.0f}  {rate[name] / rate['naive']:>7.2f}x  "
              f"{vs_one:>11}  {median[name]:>12,.0f}  {min(cpu[name]):>6.1f}")
    if "w1" in rate and "w2" in rate:
        scale, vs_naive = rate["w2"] / rate["w1"], rate["w2"] / rate["naive"]
        print(f"  targets: 2 workers >= 1.6x 1 worker: {scale:.2f}x "
              f"({'met' if scale >= 1.6 else 'NOT met'}); >= 3x naive: {vs_naive:.2f}x "
              f"({'met' if vs_naive >= 3 else 'NOT met'})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", help="tokenizer dir (default: train a 16k BPE here)")
    parser.add_argument("--vocab-size", type=int, default=16384)
    parser.add_argument("--repeat", type=int, default=4,
                        help="copies of the sample corpus (amortizes the ~0.5 CPU-s start of "
                             "each worker process, as a real corpus does)")
    parser.add_argument("--unit", nargs="+", choices=("scene", "paragraph"),
                        default=["scene", "paragraph"], help="what one document is")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-size", type=int, default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import warnings

    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
    import megatron.core.datasets.indexed_dataset  # noqa: F401  (import cost outside timings)

    from megatron_biglm.data.preprocess import DEFAULT_BATCH_SIZE
    from megatron_biglm.data.tokenizer import load_tokenizer, train_bpe_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpora = {unit: _corpus(tmp, args.repeat, unit) for unit in args.unit}
        tokenizer_dir = args.tokenizer or train_bpe_tokenizer(
            [corpora[args.unit[0]]], args.vocab_size, tmp / "tok")
        tokenizer = load_tokenizer(tokenizer_dir)
        batch_size = args.batch_size or DEFAULT_BATCH_SIZE
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"preprocess throughput: {args.repeat}x sample corpus, vocab {len(tokenizer):,}, "
              f"batch {batch_size}, best of {args.trials} trials; {os.cpu_count()} CPUs, "
              f"load average {load:.1f} at start")
        for unit, corpus in corpora.items():
            _report(unit, *_measure(corpus, tokenizer, tmp, args.workers, args.trials, batch_size),
                    args.workers)
        scaling = machine_scaling(corpora[args.unit[0]], tokenizer, args.trials, args.repeat)
        print(f"machine ceiling: 2 concurrent tokenizer processes run {scaling:.2f}x one "
              f"(pure tokenizing, no I/O; 2.00 on two idle, independent cores)")
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        busy = load > (os.cpu_count() or 1)
        print(f"load average {load:.1f} at the end" + (
            f" (above {os.cpu_count()} CPUs: other processes shared them; compare the worker "
            "ratios with the machine ceiling)" if busy else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
