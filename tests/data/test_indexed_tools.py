"""Merge and inspect: a merge reads back as the concatenation; inspect prints the decoded
document; a corrupt .idx/.bin is refused with the file named."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from preprocess_fixtures import (bpe, bpe_dir, corpus_texts, expected_ids, load_tool,  # noqa: F401
                                 read_back)


def _build(prefix, documents, dtype=np.uint16, split_every=None):
    """Write documents with megatron-core's builder; `split_every` makes multi-sequence docs."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in documents:
        doc = np.asarray(doc, dtype=dtype)
        cuts = list(range(0, doc.size, split_every or max(doc.size, 1)))[1:]
        lengths = np.diff([0, *cuts, doc.size]).tolist() if doc.size else [0]
        builder.add_document(doc, lengths)
    builder.finalize(f"{prefix}.idx")
    return str(prefix)


@pytest.fixture(scope="module")
def two_parts(corpus_jsonl, corpus_texts, bpe, tmp_path_factory):
    from megatron_biglm.data.preprocess import preprocess

    root = tmp_path_factory.mktemp("parts")
    half = len(corpus_texts) // 2
    for name, texts in (("a", corpus_texts[:half]), ("b", corpus_texts[half:])):
        path = root / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        preprocess([path], root / name, bpe)
    return root, [str(root / "a_text_document"), str(root / "b_text_document")]


def test_merge_reads_back_as_the_concatenation(two_parts, corpus_texts, bpe, capsys):
    root, prefixes = two_parts
    tool = load_tool("merge_datasets")
    assert tool.main(["--input", prefixes[0] + ".idx", prefixes[1], "--output-prefix",
                      str(root / "merged")]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    expected = expected_ids(bpe, corpus_texts, True)
    assert read_back(root / "merged") == expected
    assert result["documents"] == len(corpus_texts) and result["tokens"] == sum(map(len, expected))
    # a directory input merges every dataset inside, sorted; repeating an input upsamples it
    from megatron_biglm.data.indexed_tools import merge_datasets

    os.makedirs(root / "out", exist_ok=True)
    merge_datasets([prefixes[1], prefixes[1]], root / "out" / "twice")
    assert read_back(root / "out" / "twice") == 2 * expected[len(corpus_texts) // 2:]


def test_merge_keeps_multi_sequence_documents_over_random_draws(tmp_path):
    from megatron_biglm.data.indexed_tools import check_dataset, dataset_stats, merge_datasets

    rng = np.random.default_rng(0)
    for trial in range(3):  # each merge runs megatron's gc.collect() per input: keep it small
        parts, all_docs = [], []
        for p in range(int(rng.integers(1, 4))):
            docs = [rng.integers(0, 50_000, size=int(rng.integers(0, 30))).tolist()
                    for _ in range(int(rng.integers(1, 12)))]
            parts.append(_build(tmp_path / f"t{trial}p{p}", docs, split_every=int(rng.integers(1, 8))))
            all_docs += docs
        merged = merge_datasets(parts, tmp_path / f"t{trial}merged")
        assert read_back(tmp_path / f"t{trial}merged") == all_docs
        index = check_dataset(tmp_path / f"t{trial}merged")
        assert index.document_lengths().tolist() == [len(d) for d in all_docs]
        stats = dataset_stats(tmp_path / f"t{trial}merged")
        assert stats["documents"] == merged["documents"] == len(all_docs)
        assert stats["tokens"] == sum(map(len, all_docs)) and stats["dtype"] == "uint16"
        assert stats["tokens_per_document"]["max"] == max(map(len, all_docs))


def test_inspect_prints_stats_and_the_decoded_document(two_parts, corpus_texts, bpe_dir, capsys):
    _, prefixes = two_parts
    tool = load_tool("inspect_dataset")
    assert tool.main([prefixes[0], "--doc", "1", "-1", "--tokenizer", str(bpe_dir)]) == 0
    out = capsys.readouterr().out
    half = len(corpus_texts) // 2
    assert f"{half:,} documents" in out
    assert corpus_texts[1] + "</s>" in out and corpus_texts[half - 1] + "</s>" in out
    assert tool.main([prefixes[0] + ".bin", "--doc", "0", "--json"]) == 0  # ids, no tokenizer
    lines = capsys.readouterr().out.strip().splitlines()
    stats = json.loads(lines[0])
    assert stats["documents"] == half and stats["dtype"] == "uint16"
    from megatron_biglm.data.tokenizer import load_tokenizer

    ids = [int(t) for t in lines[2].split()]
    assert ids == expected_ids(load_tokenizer(bpe_dir), [corpus_texts[0]], True)[0]
    assert tool.main([prefixes[0], "--doc", str(half)]) == 1
    assert "out of range" in capsys.readouterr().err


def _corruptions(prefix, tmp_path):
    """(name, prefix, file that must be named) for each way a dataset can be broken."""
    cases = []

    def copy(name):
        target = tmp_path / name
        for ext in (".bin", ".idx"):
            shutil.copy(prefix + ext, str(target) + ext)
        return str(target)

    magic = copy("magic")
    data = bytearray(open(magic + ".idx", "rb").read())
    data[:9] = b"NOTANIDX!"
    open(magic + ".idx", "wb").write(bytes(data))
    cases.append(("not a Megatron index", magic, magic + ".idx"))
    for name, keep in (("trunc_body", -10), ("trunc_header", 20), ("empty", 0)):
        broken = copy(name)
        data = open(broken + ".idx", "rb").read()
        open(broken + ".idx", "wb").write(data[:keep] if keep >= 0 else data[:keep])
        cases.append(("truncated", broken, broken + ".idx"))
    short_bin = copy("short_bin")
    data = open(short_bin + ".bin", "rb").read()
    open(short_bin + ".bin", "wb").write(data[:-2])
    cases.append(("truncated .bin", short_bin, short_bin + ".bin"))
    no_bin = copy("no_bin")
    os.remove(no_bin + ".bin")
    cases.append(("no such file", no_bin, no_bin + ".bin"))
    return cases


def test_corrupt_index_is_refused_with_the_file_named(two_parts, tmp_path, capsys):
    from megatron_biglm.data.indexed_tools import CorruptDatasetError, check_dataset

    _, prefixes = two_parts
    inspect_tool, merge_tool = load_tool("inspect_dataset"), load_tool("merge_datasets")
    for message, broken, named in _corruptions(prefixes[0], tmp_path):
        with pytest.raises(CorruptDatasetError, match=message) as error:
            check_dataset(broken)
        assert str(error.value).startswith(named)
        assert inspect_tool.main([broken, "--doc", "0"]) == 1
        assert named in capsys.readouterr().err
        assert merge_tool.main(["--input", prefixes[1], broken, "--output-prefix",
                                str(tmp_path / "m")]) == 1
        assert named in capsys.readouterr().err
        assert not (tmp_path / "m.idx").exists()


def test_merge_refuses_mixed_dtypes_and_overwriting_an_input(tmp_path):
    from megatron_biglm.data.indexed_tools import merge_datasets

    small = _build(tmp_path / "small", [[1, 2, 3]], np.uint16)
    large = _build(tmp_path / "large", [[70_000, 2]], np.int32)
    with pytest.raises(ValueError, match="different dtypes"):
        merge_datasets([small, large], tmp_path / "m")
    with pytest.raises(ValueError, match="also an input"):
        merge_datasets([small, small + ".idx"], small)
    assert sorted(os.listdir(tmp_path)) == ["large.bin", "large.idx", "small.bin", "small.idx"]


def test_batched_writes_are_byte_identical_to_megatron_per_document_writes(tmp_path):
    from megatron_biglm.data.indexed_tools import AtomicIndexedWriter

    rng = np.random.default_rng(1)
    for trial, dtype in enumerate([np.uint16, np.int32, np.uint16]):
        documents = [rng.integers(0, 60_000, size=int(rng.integers(1, 50))).tolist()
                     for _ in range(int(rng.integers(1, 80)))]
        reference = _build(tmp_path / f"ref{trial}", documents, dtype)
        writer = AtomicIndexedWriter(str(tmp_path / f"ours{trial}"), dtype)
        start = 0
        while start < len(documents):  # random batch boundaries
            stop = start + int(rng.integers(1, 10))
            batch = documents[start:stop]
            writer.add_documents(np.concatenate([np.asarray(d) for d in batch]),
                                 np.array([len(d) for d in batch]))
            start = stop
        writer.commit()
        for ext in (".bin", ".idx"):
            assert (tmp_path / f"ours{trial}{ext}").read_bytes() == open(reference + ext, "rb").read()


def _copy_dataset(prefix, target):
    for ext in (".bin", ".idx"):
        shutil.copy(prefix + ext, str(target) + ext)
    return str(target)


def test_truncated_bin_is_refused_with_both_sizes_and_the_fix(two_parts, bpe_dir, tmp_path, capsys):
    """A .bin cut to half its size. megatron-core would fail deep in its
    reader with a bare offset error; every opener names the file, both sizes and the fix."""
    from megatron_biglm.data.indexed_tools import CorruptDatasetError, check_dataset

    _, prefixes = two_parts
    half = _copy_dataset(prefixes[0], tmp_path / "half")
    full_size = os.path.getsize(half + ".bin")
    with open(half + ".bin", "r+b") as fh:
        fh.truncate(full_size // 2)
    expected = [f"{half}.bin", f"{full_size // 2:,} bytes", f"describes {full_size:,} bytes",
                "re-run python -m megatron_biglm.cli.preprocess"]
    with pytest.raises(CorruptDatasetError) as error:
        check_dataset(half)
    assert all(part in str(error.value) for part in expected), str(error.value)
    assert load_tool("inspect_dataset").main([half, "--tokenizer", str(bpe_dir)]) == 1
    err = capsys.readouterr().err
    assert all(part in err for part in expected), err
    assert load_tool("merge_datasets").main(["--input", prefixes[1], half, "--output-prefix",
                                             str(tmp_path / "m")]) == 1
    err = capsys.readouterr().err
    assert all(part in err for part in expected), err
    assert not list(tmp_path.glob("m.*"))


def test_bad_magic_and_unknown_version_are_refused_with_the_fix(two_parts, tmp_path):
    from megatron_biglm.data.indexed_tools import CorruptDatasetError, check_dataset

    _, prefixes = two_parts
    for name, offset, value, message in (("magic", 0, b"GPTIDX\x00\x00\x00", "not a Megatron index"),
                                         ("version", 9, (2).to_bytes(8, "little"),
                                          "unsupported index version 2")):
        broken = _copy_dataset(prefixes[0], tmp_path / name)
        data = bytearray(open(broken + ".idx", "rb").read())
        data[offset:offset + len(value)] = value
        open(broken + ".idx", "wb").write(bytes(data))
        with pytest.raises(CorruptDatasetError, match=message) as error:
            check_dataset(broken)
        assert str(error.value).startswith(broken + ".idx")
        assert "re-run python -m megatron_biglm.cli.preprocess" in str(error.value)


def test_dtype_and_ids_are_checked_against_the_tokenizer_vocab(two_parts, bpe_dir, tmp_path, capsys):
    from megatron_biglm.data.indexed_tools import CorruptDatasetError, check_dataset, dataset_stats
    from megatron_biglm.data.tokenizer import load_tokenizer

    _, prefixes = two_parts
    vocab = len(load_tokenizer(bpe_dir))
    assert check_dataset(prefixes[0], vocab_size=vocab).num_tokens > 0  # the tokenizer it was made with
    # A vocabulary a uint16 file cannot hold (its ids would have been cut on write).
    with pytest.raises(CorruptDatasetError, match=r"stored as uint16 \(ids up to 65,535\).* 70,000 tokens"):
        check_dataset(prefixes[0], vocab_size=70_000)
    # Ids past the tokenizer's end: the data came from another (larger) tokenizer.
    foreign = _build(tmp_path / "foreign", [[5, 6, 7], [1, vocab + 3, 2]])
    with pytest.raises(CorruptDatasetError, match=f"holds token id {vocab + 3}.*different tokenizer"):
        check_dataset(foreign, vocab_size=vocab)
    with pytest.raises(CorruptDatasetError, match="holds token id -4"):
        check_dataset(_build(tmp_path / "negative", [[1, -4, 2]], np.int32), vocab_size=vocab)
    assert dataset_stats(foreign)["tokens"] == 6  # without a tokenizer only the files are checked
    assert load_tool("inspect_dataset").main([foreign, "--tokenizer", str(bpe_dir)]) == 1
    assert f"holds token id {vocab + 3}" in capsys.readouterr().err
    assert load_tool("merge_datasets").main(["--input", prefixes[0], foreign, "--output-prefix",
                                             str(tmp_path / "m"), "--tokenizer", str(bpe_dir)]) == 1
    assert "re-run python -m megatron_biglm.cli.preprocess" in capsys.readouterr().err
    assert not list(tmp_path.glob("m.*"))
