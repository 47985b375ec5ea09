"""Masked samples per second per core: the BiGLM objective on top of the indexed-data fetch.

Baseline (measured in the same run, interleaved in rounds so machine load hits all equally):
the window fetch alone, i.e. megatron's sample/shuffle-index lookup plus IndexedDataset reads
(`MaskedLMDataset.window`). Measured: full masked samples (`MaskedLMDataset[i]`) in token and
span suffix modes. Goals: masking adds <= 30 % over the fetch; >= 1M tokens/s/core.

    python -m benchmarks objective [--seq-length 2048] [--samples 300] [--rounds 7]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SPECIALS = ["<s>", "</s>", "<pad>", "<mask>"]


def _real_documents(max_plays: int):
    """Shakespeare scenes from the sample corpus, or None when it cannot be fetched."""
    from megatron_biglm.data import sample_corpus

    try:
        sample_corpus.play_files()
    except sample_corpus.CorpusUnavailable:
        return None
    path = Path(tempfile.mkdtemp()) / "corpus.jsonl"
    sample_corpus.write_jsonl(path, max_plays=max_plays)
    return [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]


def build_corpus(workdir: Path, max_plays: int):
    """(prefix, TokenIds, description): real text through a byte-level BPE, else Zipf ids."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from megatron_biglm.data.token_ids import TokenIds

    docs = _real_documents(max_plays)
    if docs is not None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(docs, trainers.BpeTrainer(
            vocab_size=8192, special_tokens=SPECIALS, show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        ids = {s: tok.token_to_id(s) for s in SPECIALS}
        encoded = [e.ids for e in tok.encode_batch(docs)]
        vocab, what = tok.get_vocab_size(), f"{len(docs)} Shakespeare scenes, byte-level BPE {tok.get_vocab_size()}"
    else:
        rng = np.random.default_rng(0)
        ids = {s: i for i, s in enumerate(SPECIALS)}
        encoded = [(rng.zipf(1.2, size=int(rng.integers(500, 5000))) % 32000 + 4).tolist() for _ in range(800)]
        vocab, what = 32004, "synthetic Zipf ids (sample corpus unavailable)"
    prefix = str(workdir / "corpus")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for doc in encoded:
        builder.add_document(np.asarray(doc + [ids["</s>"]], dtype=np.uint16), [len(doc) + 1])
    builder.finalize(prefix + ".idx")
    token_ids = TokenIds(vocab_size=vocab, mask_id=ids["<mask>"], eos_id=ids["</s>"],
                         pad_id=ids["<pad>"], bos_id=ids["<s>"])
    n_tokens = sum(len(d) + 1 for d in encoded)
    return prefix, token_ids, f"{what}, {n_tokens:,} tokens"


def _per_sample_seconds(fn, indices) -> float:
    start = time.perf_counter()
    for i in indices:
        fn(i)
    return (time.perf_counter() - start) / len(indices)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--samples", type=int, default=300, help="samples per timed block")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds; the median is reported")
    parser.add_argument("--max-plays", type=int, default=12)
    args = parser.parse_args(argv)

    import torch

    from megatron_biglm.data.pretrain_data import build_pretrain_datasets
    from megatron_biglm.common.process_groups import single_process_group

    torch.set_num_threads(1)  # per core
    workdir = Path(tempfile.mkdtemp(prefix="bench_objective_"))
    prefix, token_ids, corpus = build_corpus(workdir, args.max_plays)
    n = args.samples
    with single_process_group():
        def dataset(unit):
            return build_pretrain_datasets(
                {"blend": [prefix], "split": "100,0,0", "seq_length": args.seq_length, "seed": 1,
                 "cache_dir": str(workdir / "cache")},
                token_ids=token_ids, objective={"suffix_unit": unit}, train_samples=n * args.rounds).train

        token_ds, span_ds = dataset("token"), dataset("span")
        gen = np.random.default_rng(0)
        cases = {"fetch (baseline)": token_ds.window,
                 # the least any per-token masking can cost in numpy: one uniform per token
                 "floor: 1 uniform/token": lambda i: gen.random(args.seq_length),
                 "masked, token suffix": token_ds.__getitem__,
                 "masked, span suffix": span_ds.__getitem__}
        for fn in cases.values():  # warm the page cache and lazy imports
            _per_sample_seconds(fn, range(min(n, 50)))
        times = {name: [] for name in cases}
        for r in range(args.rounds):
            block = range(r * n, (r + 1) * n)
            for name, fn in cases.items():
                times[name].append(_per_sample_seconds(fn, block))

    base = statistics.median(times["fetch (baseline)"])
    print(f"objective benchmark: seq {args.seq_length}, 1 thread, {n} samples x {args.rounds} rounds; {corpus}")
    print(f"{'case':24s} {'us/sample':>10s} {'samples/s':>10s} {'Mtok/s':>8s} {'vs fetch':>9s} {'overhead':>9s}")
    ok = True
    for name, ts in times.items():
        t = statistics.median(ts)
        ratio = t / base
        print(f"{name:24s} {t * 1e6:10.1f} {1 / t:10.0f} {args.seq_length / t / 1e6:8.2f} "
              f"{ratio:8.2f}x {100 * (ratio - 1):8.0f}%")
        if name.startswith("masked"):
            ok &= args.seq_length / t >= 1e6
    masked_worst = max(statistics.median(times[k]) for k in cases if k.startswith("masked"))
    print(f"goal >= 1M tokens/s/core: {'met' if ok else 'MISSED'}; "
          f"goal masking <= 30% over fetch: {'met' if masked_worst <= 1.3 * base else 'MISSED'} "
          f"(+{100 * (masked_worst / base - 1):.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
