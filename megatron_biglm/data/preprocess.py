"""Corpus files -> Megatron indexed datasets (`{prefix}_{key}_document.{bin,idx}`).

What Megatron-LM's `python -m megatron_biglm.cli.preprocess` does, with the parts it lacks: HF fast
tokenizers in batches, parquet and .gz/.zst inputs, counted (never fatal, never silent)
bad input, and outputs that appear only when complete.

Design:
  * The main process reads and parses (cheap) and writes; N worker processes tokenize
    batches of documents. Batches go out through a bounded window and come back in
    submission order, so the output is byte-identical for any worker count and memory stays
    flat on corpora of any size.
  * Each worker runs the Rust tokenizer single-threaded (`TOKENIZERS_PARALLELISM=false`),
    so `workers` is the number of cores used, and `encode_batch_fast` (no offsets).
    Tokens are `tokenizer(text, add_special_tokens=False)` plus EOS when `append_eod`;
    the BiGLM datasets add BOS themselves.
  * The .bin/.idx are written by megatron-core's `IndexedDatasetBuilder` under temporary
    names, then renamed (`indexed_tools.AtomicIndexedWriter`): an interrupted run leaves no
    .idx that looks valid.
  * Workers start with `spawn`: they import this module, numpy and `tokenizers` (not torch,
    megatron or transformers) and are safe however the parent process was set up. Like any
    spawned process they also re-import the calling script (`__main__`): a script calling
    `preprocess(workers>1)` must keep its work, and ideally its heavy imports, under
    `if __name__ == "__main__":`. Each worker costs ~0.5 CPU-s to start.
"""
from __future__ import annotations

import itertools
import json
import logging
import multiprocessing
import os
import sys
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from megatron_biglm.data.indexed_tools import AtomicIndexedWriter
from megatron_biglm.data.readers import Record, SkipReport, expand_inputs, records_from_files
from megatron_biglm.data.tokenizer import dtype_for_vocab, load_tokenizer

logger = logging.getLogger(__name__)

EMPTY_AFTER_TOKENIZATION = "empty_after_tokenization"
DEFAULT_BATCH_SIZE = 128


class PreprocessError(RuntimeError):
    """A fatal condition (no input, nothing readable, nothing written); says what to do."""


def output_prefix_for(output_prefix, key: str) -> str:
    """Megatron's naming: `{output_prefix}_{key}_document` (+ .bin / .idx)."""
    return f"{output_prefix}_{key}_document"


# ---------------------------------------------------------------- encoding (in workers)

_ENCODER = None


@dataclass
class _EncoderSpec:
    """What a worker needs to rebuild the tokenizer: small and picklable."""
    tokenizer_json: str
    split_special_tokens: bool
    eos_id: int
    append_eod: bool
    dtype: str


class _Encoder:
    def __init__(self, spec: _EncoderSpec):
        self.tokenizer = Tokenizer.from_str(spec.tokenizer_json)
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.tokenizer.encode_special_tokens = spec.split_special_tokens
        self.eos = [spec.eos_id] if spec.append_eod else []
        self.dtype = np.dtype(spec.dtype)

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(lengths int64[n], tokens dtype[sum(lengths)]) for a batch: compact to pickle."""
        encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        ids = [encoding.ids + self.eos for encoding in encodings]
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        tokens = np.fromiter(itertools.chain.from_iterable(ids), dtype=self.dtype,
                             count=int(lengths.sum()))
        return lengths, tokens


def _init_worker(spec: _EncoderSpec) -> None:
    global _ENCODER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _ENCODER = _Encoder(spec)


def _encode_in_worker(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    return _ENCODER.encode(texts)


@contextmanager
def _single_threaded_tokenizers():
    """Keep the Rust tokenizer on one thread in this process for the duration."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


# ---------------------------------------------------------------- batching and ordering

@dataclass
class _Batch:
    texts: list[str] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)      # index into json_keys, per text
    where: list[tuple[str, int]] = field(default_factory=list)


def _batches(records: Iterable[Record], keys: Sequence[str], batch_size: int) -> Iterator[_Batch]:
    key_index = {key: i for i, key in enumerate(keys)}
    batch = _Batch()
    for record in records:
        for key, text in record.texts.items():
            batch.texts.append(text)
            batch.keys.append(key_index[key])
            batch.where.append((record.source, record.line))
        if len(batch.texts) >= batch_size:
            yield batch
            batch = _Batch()
    if batch.texts:
        yield batch


def _start_workers(spec: _EncoderSpec, workers: int) -> ProcessPoolExecutor | None:
    """Start the tokenizer processes now (one warm-up task each), so their start overlaps
    whatever the caller does next (importing megatron, opening outputs)."""
    if workers <= 1:
        return None
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_init_worker, initargs=(spec,))
    for _ in range(workers):
        pool.submit(_encode_in_worker, [])
    return pool


def _ordered_encode(batches: Iterator[_Batch], spec: _EncoderSpec, pool, workers: int):
    """Yield (batch, (lengths, tokens)) in input order: in this process when `pool` is None,
    else in the pool with at most 4 batches per worker in flight, so reading never runs
    ahead of tokenizing by more than that. (A concurrent.futures pool: a dead worker raises
    instead of hanging like multiprocessing.Pool.)"""
    if pool is None:
        encoder = _Encoder(spec)
        with _single_threaded_tokenizers():
            for batch in batches:
                yield batch, encoder.encode(batch.texts)
        return
    pending: deque = deque()
    try:
        for batch in batches:
            pending.append((batch, pool.submit(_encode_in_worker, batch.texts)))
            if len(pending) >= 4 * workers:
                done, future = pending.popleft()
                yield done, future.result()
        while pending:
            done, future = pending.popleft()
            yield done, future.result()
    except BrokenProcessPool as exc:
        raise PreprocessError(
            "a tokenizer worker process died (see its error above; workers start with "
            "'spawn', which re-imports the main script, so run from a file, not stdin). "
            "workers=1 tokenizes in this process") from exc


# ---------------------------------------------------------------- progress

class _Progress:
    """tqdm bar on a terminal, a plain log line every `interval` s otherwise, or nothing."""

    def __init__(self, enabled: bool, interval: float = 10.0):
        self.enabled, self.interval = enabled, interval
        self.start = self.last = time.perf_counter()
        self.documents = self.tokens = 0
        self.bar = None
        if enabled and sys.stderr.isatty():
            self.bar = tqdm(unit=" docs", desc="preprocess", dynamic_ncols=True)

    def update(self, documents: int, tokens: int) -> None:
        self.documents += documents
        self.tokens += tokens
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.bar is not None:
            self.bar.update(documents)
            self.bar.set_postfix_str(f"{self.tokens / max(now - self.start, 1e-9):,.0f} tok/s",
                                     refresh=False)
        elif now - self.last >= self.interval:
            self.last = now
            elapsed = max(now - self.start, 1e-9)
            logger.info("%d docs, %d tokens, %.0f docs/s, %.0f tokens/s", self.documents,
                        self.tokens, self.documents / elapsed, self.tokens / elapsed)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ---------------------------------------------------------------- entry point

def preprocess(inputs, output_prefix, tokenizer, *, json_keys: Sequence[str] = ("text",),
               workers: int = 1, append_eod: bool = True, strict: bool = False,
               batch_size: int = DEFAULT_BATCH_SIZE, text_mode: str = "block",
               input_format: str = "auto", progress: bool = False) -> dict:
    """Tokenize `inputs` (paths, globs, directories; jsonl/text/parquet, .gz/.zst) into one
    Megatron indexed dataset per key, `{output_prefix}_{key}_document.{bin,idx}`.

    `tokenizer` is a loaded tokenizer or anything `load_tokenizer` takes. Returns the
    summary: documents, tokens, skipped (reason -> count), skipped_examples (file:line),
    files, bytes, seconds, docs_per_s, tokens_per_s, dtype, outputs (per key). Raises
    `BadInputError` on the first bad input when `strict`, and `PreprocessError` when there
    are no input files, none is readable, or no document survives.
    """
    keys = tuple(json_keys)
    if not keys or len(set(keys)) != len(keys):
        raise ValueError(f"json_keys must be distinct and non-empty, got {list(keys)}")
    if workers < 1 or batch_size < 1:
        raise ValueError(f"workers and batch_size must be >= 1 (got {workers}, {batch_size})")
    if workers > (os.cpu_count() or 1):
        logger.warning("%d workers on %s CPUs: expect no speed-up beyond the core count",
                       workers, os.cpu_count())
    start = time.perf_counter()
    tokenizer = load_tokenizer(tokenizer)
    vocab_size = max(len(tokenizer), max(tokenizer.get_vocab().values()) + 1)
    dtype = dtype_for_vocab(vocab_size)
    spec = _EncoderSpec(tokenizer.backend_tokenizer.to_str(),
                        bool(getattr(tokenizer, "split_special_tokens", False)),
                        int(tokenizer.eos_token_id), append_eod, np.dtype(dtype).name)

    report = SkipReport(strict=strict)
    files = expand_inputs(inputs, report)
    if not files:
        raise PreprocessError(f"no input files: {list(map(str, _as_list(inputs)))} matched "
                              "nothing; check the paths or quote the glob")
    Path(output_prefix).parent.mkdir(parents=True, exist_ok=True)
    writers: list[AtomicIndexedWriter] = []
    bar = _Progress(False)
    pool = _start_workers(spec, workers)
    try:
        for key in keys:
            writers.append(AtomicIndexedWriter(output_prefix_for(output_prefix, key), dtype))
        bar = _Progress(progress)  # after the writers' megatron import: rates from here
        records = records_from_files(files, json_keys=keys, report=report, text_mode=text_mode,
                                     input_format_name=input_format)
        encoded = closing(_ordered_encode(_batches(records, keys, batch_size), spec, pool, workers))
        with encoded as results:
            for batch, (lengths, tokens) in results:
                _write_batch(batch, lengths, tokens, writers, keys, report)
                bar.update(len(batch.keys), int(lengths.sum()))
        _check_something_written(files, report, writers, keys)
        for writer in writers:
            writer.commit()
    except BaseException:
        for writer in writers:
            writer.discard()
        raise
    finally:
        bar.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    return _summary(files, report, writers, keys, dtype, vocab_size, workers, append_eod,
                    time.perf_counter() - start)


def _write_batch(batch: _Batch, lengths, tokens, writers, keys, report: SkipReport) -> None:
    """Route a batch's documents to their key's writer (in order), skipping empty ones."""
    key_of = np.asarray(batch.keys)
    for i in np.flatnonzero(lengths == 0):
        source, line = batch.where[i]
        report.skip(EMPTY_AFTER_TOKENIZATION, source, line,
                    f"key {keys[key_of[i]]!r} encodes to no tokens")
    for key_index, writer in enumerate(writers):
        chosen = (key_of == key_index) & (lengths > 0)
        if chosen.all():
            writer.add_documents(tokens, lengths)
        elif chosen.any():
            writer.add_documents(tokens[np.repeat(chosen, lengths)], lengths[chosen])


def _as_list(inputs) -> list:
    return [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)


def _check_something_written(files, report: SkipReport, writers, keys) -> None:
    """Fatal when nothing was written (a truncated file that yielded documents is not)."""
    if not any(writer.documents for writer in writers):
        first_skips = "; ".join(report.example_lines()[:5])
        if report.files_seen and report.files_failed == report.files_seen:
            raise PreprocessError(f"none of the {len(files)} input files could be read: "
                                  f"{first_skips}")
        raise PreprocessError(f"no documents for keys {list(keys)} in {len(files)} files "
                              f"({report.summary_line()}); check --json-keys and the input. "
                              f"First skips: {first_skips}")
    for key, writer in zip(keys, writers):
        if not writer.documents:
            logger.warning("key %r got no documents: %s will be empty", key, writer.prefix)


def _summary(files, report, writers, keys, dtype, vocab_size, workers, append_eod, seconds):
    outputs = {}
    for key, writer in zip(keys, writers):
        outputs[key] = {"prefix": writer.prefix, "documents": writer.documents,
                        "tokens": writer.tokens, "bin_bytes": os.path.getsize(writer.bin_path),
                        "idx_bytes": os.path.getsize(writer.idx_path)}
    documents = sum(o["documents"] for o in outputs.values())
    tokens = sum(o["tokens"] for o in outputs.values())
    return {
        "documents": documents,
        "tokens": tokens,
        "skipped": report.as_dict(),
        "skipped_examples": report.example_lines(),
        "files": len(files),
        "unreadable_files": report.files_failed,
        "bytes": sum(o["bin_bytes"] + o["idx_bytes"] for o in outputs.values()),
        "seconds": round(seconds, 3),
        "docs_per_s": round(documents / seconds, 1) if seconds > 0 else None,
        "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None,
        "dtype": np.dtype(dtype).name,
        "vocab_size": vocab_size,
        "workers": workers,
        "append_eod": append_eod,
        "outputs": outputs,
    }


def format_summary(summary: dict) -> list[str]:
    """Human-readable summary lines, ending with the whole summary as one JSON line."""
    lines = [f"preprocessed {summary['files']} files with {summary['workers']} workers in "
             f"{summary['seconds']:.1f} s",
             f"  documents  {summary['documents']:,}   tokens {summary['tokens']:,}   "
             f"(dtype {summary['dtype']}, vocab {summary['vocab_size']:,}, "
             f"EOS appended: {summary['append_eod']})"]
    skipped = summary["skipped"]
    reasons = ", ".join(f"{reason} {n:,}" for reason, n in skipped.items())
    lines.append(f"  skipped    {sum(skipped.values()):,}" + (f" ({reasons})" if reasons else ""))
    lines += [f"    {example}" for example in summary["skipped_examples"]]
    for key, out in summary["outputs"].items():
        lines.append(f"  output     {out['prefix']}.{{bin,idx}}: {out['documents']:,} docs, "
                     f"{out['tokens']:,} tokens, {out['bin_bytes'] + out['idx_bytes']:,} bytes")
    lines.append(f"  throughput {summary['docs_per_s'] or 0:,.1f} docs/s, "
                 f"{summary['tokens_per_s'] or 0:,.0f} tokens/s")
    lines.append(json.dumps(summary, sort_keys=True))
    return lines
