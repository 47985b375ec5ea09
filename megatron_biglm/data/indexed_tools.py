"""Check, inspect, read and merge Megatron indexed datasets (`PREFIX.bin` + `PREFIX.idx`).

megatron-core's reader trusts its input: a truncated or foreign `.idx` fails with a bare
`AssertionError` or garbage lengths, far from the file at fault. `check_dataset` validates
the header and sizes first (layout in /work/shared/notes/reference_facts.md) and raises
`CorruptDatasetError` naming the file, what is wrong and what to do. Given the tokenizer's
vocabulary size it also refuses data that cannot belong to that tokenizer (a dtype too narrow
for the vocabulary, token ids past its end). Every opener calls it: the pretraining datasets
(data/pretrain_data.py, training/build.py), inspect and merge. Reading and writing themselves
go through megatron-core (`IndexedDataset`, `IndexedDatasetBuilder`).
"""
from __future__ import annotations

import glob
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

INDEX_MAGIC = b"MMIDIDX\x00\x00"
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, documents + 1
_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
           7: np.float32, 8: np.uint16}


REMEDY = "re-run python -m megatron_biglm.cli.preprocess to re-create PREFIX.bin and PREFIX.idx together"
# How many sequences, spread over the corpus, the token-id scan reads: a tokenizer mismatch
# shows in any of them, and the max over a pretraining corpus would read terabytes.
_ID_SCAN_SEQUENCES = 256


class CorruptDatasetError(ValueError):
    """An .idx/.bin pair that megatron-core could not read correctly, or data that does not
    fit the tokenizer; names the file, what is wrong and what to do."""


@dataclass(frozen=True)
class DatasetIndex:
    """A validated `.idx`: its header and arrays (read-only views of the file)."""
    prefix: str
    dtype: type
    sequence_lengths: np.ndarray   # int32[N]
    sequence_pointers: np.ndarray  # int64[N], byte offsets into .bin
    document_indices: np.ndarray   # int64[D+1], sequence index where each document starts
    multimodal: bool

    @property
    def num_documents(self) -> int:
        return int(self.document_indices.size - 1)

    @property
    def num_tokens(self) -> int:
        return int(self.sequence_lengths.sum(dtype=np.int64))

    def document_lengths(self) -> np.ndarray:
        """Tokens per document (a document may span several sequences)."""
        cumulative = np.concatenate(([0], np.cumsum(self.sequence_lengths, dtype=np.int64)))
        return cumulative[self.document_indices[1:]] - cumulative[self.document_indices[:-1]]


def dataset_prefix(path) -> str:
    """`x.bin`, `x.idx` or `x` -> `x`."""
    path = str(path)
    return path[:-4] if path.endswith((".bin", ".idx")) else path


def expand_prefixes(inputs: Sequence) -> list[str]:
    """Prefixes, .bin/.idx paths, globs and directories (every .idx inside, sorted) -> the
    list of dataset prefixes, in the order given (a repeat is kept: merging a dataset twice
    upsamples it)."""
    prefixes: list[str] = []
    for item in ([inputs] if isinstance(inputs, (str, os.PathLike)) else inputs):
        item = str(item)
        if os.path.isdir(item):
            found = sorted(glob.glob(os.path.join(item, "*.idx")))
            if not found:
                raise CorruptDatasetError(f"{item}: directory holds no .idx files")
        elif glob.has_magic(item):
            found = sorted(glob.glob(item))
            if not found:
                raise CorruptDatasetError(f"{item}: pattern matched no files")
        else:
            found = [item]
        prefixes += [dataset_prefix(path) for path in found]
    return prefixes


def check_dataset(prefix, vocab_size: int | None = None) -> DatasetIndex:
    """Validate PREFIX.idx (magic, version, dtype, sizes, pointers) and PREFIX.bin (size);
    with `vocab_size` (the tokenizer's), also that the dtype can hold every id of that
    vocabulary and that the stored ids (a bounded sample of sequences) are below it."""
    prefix = dataset_prefix(prefix)
    idx_path, bin_path = prefix + ".idx", prefix + ".bin"
    for path in (idx_path, bin_path):
        if not os.path.isfile(path):
            raise CorruptDatasetError(f"{path}: no such file (a dataset is PREFIX.bin + PREFIX.idx)")
    size = os.path.getsize(idx_path)
    with open(idx_path, "rb") as fh:
        head = fh.read(_HEADER.size)
    if not (head.startswith(INDEX_MAGIC) or (len(head) < 9 and INDEX_MAGIC.startswith(head))):
        raise CorruptDatasetError(f"{idx_path}: not a Megatron index (starts with {head[:9]!r}, "
                                  f"expected {INDEX_MAGIC!r}); {REMEDY}")
    if len(head) < _HEADER.size:
        raise CorruptDatasetError(f"{idx_path}: truncated header ({size} bytes, need {_HEADER.size}); {REMEDY}")
    _, version, code, sequences, document_count = _HEADER.unpack(head)
    if version != 1:
        raise CorruptDatasetError(f"{idx_path}: unsupported index version {version} (this reader, like "
                                  f"megatron-core's, reads version 1); {REMEDY}")
    if code not in _DTYPES:
        raise CorruptDatasetError(f"{idx_path}: unknown dtype code {code} (known: {sorted(_DTYPES)}); {REMEDY}")
    expected = _HEADER.size + sequences * 12 + document_count * 8
    if size not in (expected, expected + sequences):
        raise CorruptDatasetError(
            f"{idx_path}: {size} bytes, but its header promises {sequences} sequences and "
            f"{max(document_count - 1, 0)} documents ({expected} bytes): truncated or overwritten; "
            f"{REMEDY}")
    data = np.memmap(idx_path, mode="r", dtype=np.uint8)
    offset = _HEADER.size
    lengths = np.frombuffer(data, np.int32, sequences, offset)
    pointers = np.frombuffer(data, np.int64, sequences, offset + 4 * sequences)
    documents = np.frombuffer(data, np.int64, document_count, offset + 12 * sequences)
    dtype = _DTYPES[code]
    _check_arrays(idx_path, bin_path, dtype, lengths, pointers, documents)
    index = DatasetIndex(prefix, dtype, lengths, pointers, documents, multimodal=size == expected + sequences)
    if vocab_size is not None:
        check_vocab_fits(index, int(vocab_size))
    return index


def _check_arrays(idx_path, bin_path, dtype, lengths, pointers, documents) -> None:
    itemsize = np.dtype(dtype).itemsize
    if documents.size == 0 or documents[0] != 0 or documents[-1] != lengths.size or (
            np.any(np.diff(documents) < 0)):
        raise CorruptDatasetError(f"{idx_path}: document indices must rise from 0 to the "
                                  f"sequence count {lengths.size}: corrupt index; {REMEDY}")
    if np.any(lengths < 0):
        raise CorruptDatasetError(f"{idx_path}: negative sequence lengths: corrupt index; {REMEDY}")
    starts = np.concatenate(([0], np.cumsum(lengths.astype(np.int64) * itemsize)))
    if not np.array_equal(pointers, starts[:-1]):
        raise CorruptDatasetError(f"{idx_path}: sequence pointers do not follow the lengths: "
                                  f"corrupt index; {REMEDY}")
    bin_size = os.path.getsize(bin_path)
    if bin_size != starts[-1]:
        raise CorruptDatasetError(f"{bin_path}: {bin_size:,} bytes, but {idx_path} describes "
                                  f"{int(starts[-1]):,} bytes ({int(lengths.sum(dtype=np.int64)):,} tokens "
                                  f"of {np.dtype(dtype).name}): truncated .bin, or .bin/.idx from "
                                  f"different runs; {REMEDY}")


def check_vocab_fits(index: DatasetIndex, vocab_size: int) -> None:
    """Refuse data that cannot come from a tokenizer of `vocab_size` tokens: a dtype that
    cannot store its largest id (preprocessing chooses the dtype from the vocabulary), or
    stored ids at or past the vocabulary's end (another tokenizer wrote them)."""
    bin_path, dtype = index.prefix + ".bin", np.dtype(index.dtype)
    if dtype.kind in "iu" and vocab_size - 1 > np.iinfo(dtype).max:
        raise CorruptDatasetError(
            f"{bin_path}: stored as {dtype.name} (ids up to {np.iinfo(dtype).max:,}), but the tokenizer "
            f"has {vocab_size:,} tokens: the data was preprocessed for a smaller vocabulary. Re-run "
            "python -m megatron_biglm.cli.preprocess with this tokenizer (it picks a dtype that holds every id)")
    n = index.sequence_lengths.size
    if not index.num_tokens or dtype.kind not in "iu":
        return  # nothing stored (and an empty file cannot be memory-mapped)
    tokens = np.memmap(bin_path, mode="r", dtype=dtype)
    picks = np.unique(np.linspace(0, n - 1, num=min(n, _ID_SCAN_SEQUENCES)).astype(np.int64))
    itemsize = dtype.itemsize
    for i in picks.tolist():
        start, length = int(index.sequence_pointers[i]) // itemsize, int(index.sequence_lengths[i])
        if not length:
            continue
        sequence = tokens[start:start + length]
        low, high = int(sequence.min()), int(sequence.max())
        if high >= vocab_size or low < 0:
            bad = high if high >= vocab_size else low
            raise CorruptDatasetError(
                f"{bin_path}: sequence {i} holds token id {bad}, but the tokenizer's ids are 0..{vocab_size - 1}: "
                "the data was preprocessed with a different tokenizer. Use that tokenizer, or re-run "
                "python -m megatron_biglm.cli.preprocess with this one")


def dataset_stats(prefix, vocab_size: int | None = None) -> dict:
    """Counts and document-length statistics of a (validated) dataset; `vocab_size` (the
    tokenizer's) adds check_dataset's dtype/ids check."""
    index = check_dataset(prefix, vocab_size)
    lengths = index.document_lengths()
    described = {"min": 0, "mean": 0.0, "median": 0.0, "max": 0}
    if lengths.size:
        described = {"min": int(lengths.min()), "mean": round(float(lengths.mean()), 2),
                     "median": float(np.median(lengths)), "max": int(lengths.max())}
    return {"prefix": index.prefix, "dtype": np.dtype(index.dtype).name,
            "documents": index.num_documents, "sequences": int(index.sequence_lengths.size),
            "tokens": index.num_tokens, "tokens_per_document": described,
            "multimodal": index.multimodal,
            "bin_bytes": os.path.getsize(index.prefix + ".bin"),
            "idx_bytes": os.path.getsize(index.prefix + ".idx")}


def read_document(prefix, k: int, vocab_size: int | None = None) -> np.ndarray:
    """Token ids of document `k` (negative counts from the end), read with megatron-core."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset  # lazy: start-up (megatron.core: 2.9 CPU s)

    index = check_dataset(prefix, vocab_size)
    n = index.num_documents
    if not -n <= k < n:
        raise IndexError(f"{index.prefix}: document {k} out of range; it has {n} documents")
    k %= n
    dataset = IndexedDataset(index.prefix, multimodal=index.multimodal)
    first, last = int(index.document_indices[k]), int(index.document_indices[k + 1])
    parts = [dataset[i] for i in range(first, last)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=index.dtype)


def merge_datasets(inputs: Sequence, output_prefix, vocab_size: int | None = None) -> dict:
    """Concatenate datasets (prefixes, .idx paths, globs or directories, in order) into
    `output_prefix` with megatron-core's builder. Every input passes check_dataset (with
    `vocab_size`, the tokenizer's, also its ids); all must share one dtype; the output
    appears only when complete."""
    prefixes = expand_prefixes(inputs)
    if not prefixes:
        raise ValueError("no datasets to merge")
    output_prefix = dataset_prefix(output_prefix)
    indexes = [check_dataset(prefix, vocab_size) for prefix in prefixes]
    if output_prefix in prefixes:
        raise ValueError(f"output {output_prefix} is also an input; choose another prefix")
    kinds = {(np.dtype(i.dtype).name, i.multimodal) for i in indexes}
    if len(kinds) > 1:
        listing = ", ".join(f"{i.prefix} ({np.dtype(i.dtype).name}"
                            f"{', multimodal' if i.multimodal else ''})" for i in indexes)
        raise ValueError(f"cannot merge datasets of different dtypes/kinds: {listing}; "
                         "re-run preprocessing with one tokenizer")
    Path(output_prefix).parent.mkdir(parents=True, exist_ok=True)
    writer = AtomicIndexedWriter(output_prefix, indexes[0].dtype, multimodal=indexes[0].multimodal)
    try:
        for prefix in prefixes:
            writer.builder.add_index(prefix)
        writer.commit()
    except BaseException:
        writer.discard()
        raise
    return {"output": output_prefix, "inputs": prefixes,
            "documents": sum(i.num_documents for i in indexes),
            "sequences": sum(int(i.sequence_lengths.size) for i in indexes),
            "tokens": sum(i.num_tokens for i in indexes)}


class AtomicIndexedWriter:
    """megatron-core's `IndexedDatasetBuilder` writing to temporary names; `commit` renames
    the .bin and then the .idx into place (removing an old .idx first), so no interrupted
    run leaves an .idx that looks valid. `discard` removes the temporaries."""

    def __init__(self, prefix: str, dtype, *, multimodal: bool = False):
        self.prefix = prefix
        suffix = f".tmp-{os.getpid()}"
        self.bin_path, self.idx_path = prefix + ".bin", prefix + ".idx"
        self.tmp_bin, self.tmp_idx = self.bin_path + suffix, self.idx_path + suffix
        self.builder = _batched_builder_class()(self.tmp_bin, dtype=dtype, multimodal=multimodal)
        self.documents = 0
        self.tokens = 0

    def add_documents(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append len(lengths) single-sequence documents stored back to back in `tokens`."""
        self.builder.add_documents(tokens, lengths)
        self.documents += int(lengths.size)
        self.tokens += int(tokens.size)

    def commit(self) -> None:
        self.builder.finalize(self.tmp_idx)
        if os.path.exists(self.idx_path):
            os.remove(self.idx_path)  # never pair an old .idx with the new .bin
        os.replace(self.tmp_bin, self.bin_path)
        os.replace(self.tmp_idx, self.idx_path)

    def discard(self) -> None:
        if not self.builder.data_file.closed:
            self.builder.data_file.close()
        for path in (self.tmp_bin, self.tmp_idx):
            if os.path.exists(path):
                os.remove(path)


_BATCHED_BUILDER = None


def _batched_builder_class():
    """`IndexedDatasetBuilder` plus `add_documents`: a batch of single-sequence documents in
    one write, instead of one `add_document` call (and one small write) per document. The
    bytes are those of per-document `add_document` calls. Built on first use so importing
    this module (in tokenizer workers) does not import megatron/torch."""
    global _BATCHED_BUILDER
    if _BATCHED_BUILDER is None:
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder  # lazy: start-up (megatron.core: 2.9 CPU s)

        class BatchedIndexedDatasetBuilder(IndexedDatasetBuilder):
            def add_documents(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
                if self.multimodal:
                    raise ValueError("add_documents writes text-only (non-multimodal) datasets")
                self.data_file.write(np.asarray(tokens, dtype=self.dtype).tobytes(order="C"))
                first = len(self.sequence_lengths)
                self.sequence_lengths.extend(np.asarray(lengths, dtype=np.int64).tolist())
                self.document_indices.extend(range(first + 1, first + int(lengths.size) + 1))

        _BATCHED_BUILDER = BatchedIndexedDatasetBuilder
    return _BATCHED_BUILDER
