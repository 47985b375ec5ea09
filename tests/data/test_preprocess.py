"""preprocess(): real text -> Megatron .bin/.idx that megatron-core reads back as exactly the
tokenizer's ids, for every input format, any worker count, and with bad input counted."""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from preprocess_fixtures import (REPO, bpe, bpe_dir, corpus_texts, expected_ids,  # noqa: F401
                                 load_tool, read_back)


@pytest.mark.parametrize("append_eod", [True, False])
def test_round_trip_real_text(corpus_jsonl, corpus_texts, bpe, tmp_path, append_eod):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from megatron_biglm.data.preprocess import preprocess

    summary = preprocess([corpus_jsonl], tmp_path / "out", bpe, append_eod=append_eod)
    prefix = tmp_path / "out_text_document"
    expected = expected_ids(bpe, corpus_texts, append_eod)
    assert read_back(prefix) == expected
    assert IndexedDataset(str(prefix)).index.dtype == np.uint16  # vocab 1000 < 65,500
    assert summary["documents"] == len(corpus_texts)
    assert summary["tokens"] == sum(map(len, expected))
    assert summary["skipped"] == {}
    assert summary["bytes"] == os.path.getsize(f"{prefix}.bin") + os.path.getsize(f"{prefix}.idx")
    assert os.path.getsize(f"{prefix}.bin") == 2 * summary["tokens"]
    assert sorted(os.listdir(tmp_path)) == ["out_text_document.bin", "out_text_document.idx"]


def test_two_workers_are_byte_identical_to_one(corpus_jsonl, bpe, tmp_path):
    from megatron_biglm.data.preprocess import preprocess

    outputs = {}
    for workers in (1, 2):
        preprocess([corpus_jsonl], tmp_path / f"w{workers}", bpe, workers=workers, batch_size=7)
        outputs[workers] = [(tmp_path / f"w{workers}_text_document{ext}").read_bytes()
                            for ext in (".bin", ".idx")]
    assert outputs[1] == outputs[2]


def _paragraphs(texts):
    """Blank-line-separated blocks of the scenes, as the block-mode reader must find them."""
    return [p for text in texts for p in re.split(r"\n(?:[ \t]*\n)+", text) if p.strip()]


def _write_inputs(kind, texts, directory):
    """Write `texts` as input of `kind`; return (inputs, extra kwargs, expected documents)."""
    directory.mkdir()
    lines = "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts))
    if kind == "jsonl.gz":
        with gzip.open(directory / "a.jsonl.gz", "wt", encoding="utf-8") as fh:
            fh.write(lines)
        return [directory / "a.jsonl.gz"], {}, texts
    if kind == "jsonl.zst":
        import zstandard

        half = len(lines) // 2  # two zstd frames, as written by parallel compressors
        cut = lines.index("\n", half) + 1
        data = b"".join(zstandard.ZstdCompressor().compress(part.encode()) for part in
                        (lines[:cut], lines[cut:]))
        (directory / "a.jsonl.zst").write_bytes(data)
        return [directory / "a.jsonl.zst"], {}, texts
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        split = len(texts) // 3  # several files through one glob, in sorted order
        pq.write_table(pa.table({"text": texts[:split]}), directory / "part-0.parquet", row_group_size=5)
        pq.write_table(pa.table({"text": texts[split:], "n": list(range(len(texts) - split))}),
                       directory / "part-1.parquet")
        return [str(directory / "part-*.parquet")], {}, texts
    if kind == "text-block":
        blocks = _paragraphs(texts)
        (directory / "plays.txt").write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
        return [directory / "plays.txt"], {"text_mode": "block"}, blocks
    if kind == "text-file":
        for i, text in enumerate(texts):
            (directory / f"scene{i:03d}.txt").write_text(text + "\n", encoding="utf-8")
        return [directory], {"text_mode": "file"}, texts  # a directory input
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["jsonl.gz", "jsonl.zst", "parquet", "text-block", "text-file"])
def test_compressed_parquet_and_text_inputs(kind, corpus_texts, bpe, tmp_path):
    from megatron_biglm.data.preprocess import preprocess

    texts = corpus_texts[:30]
    inputs, kwargs, documents = _write_inputs(kind, texts, tmp_path / "in")
    summary = preprocess(inputs, tmp_path / "out", bpe, **kwargs)
    assert summary["skipped"] == {}
    assert summary["documents"] == len(documents) >= 30
    assert read_back(tmp_path / "out_text_document") == expected_ids(bpe, documents, True)


def _bad_input_files(tmp_path):
    """One jsonl with each bad-line kind among good lines, plus broken files."""
    good = ["Now is the winter of our discontent", "Made glorious summer by this sun of York",
            "And all the clouds that lour'd upon our house", "In the deep bosom of the ocean buried"]
    lines = [
        json.dumps({"text": good[0]}).encode(),        # 1 ok
        b'{"text": "unterminated',                      # 2 invalid_json
        json.dumps({"body": "no text key"}).encode(),  # 3 missing_key
        json.dumps({"text": ""}).encode(),              # 4 empty_document
        json.dumps({"text": good[1]}).encode(),        # 5 ok
        b'{"text": "caf\xe9 au lait"}',                 # 6 invalid_utf8 (latin-1 byte)
        json.dumps({"text": "  \n\t "}).encode(),       # 7 empty_document (whitespace)
        json.dumps({"text": 42}).encode(),              # 8 not_a_string
        b"[1, 2, 3]",                                   # 9 not_an_object
        b"",                                            # 10 blank_line
        b'{"text": "half a pair \\ud800 here"}',        # 11 lone_surrogate
        json.dumps({"text": good[2]}).encode(),        # 12 ok
        json.dumps({"text": None}).encode(),            # 13 missing_key (null)
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join(lines) + b"\n")
    corrupt = tmp_path / "corrupt.jsonl.gz"
    corrupt.write_bytes(b"this is not gzip data at all")
    truncated = tmp_path / "truncated.jsonl.gz"
    whole = gzip.compress((json.dumps({"text": good[3]}) + "\n").encode() * 400)
    truncated.write_bytes(whole[: len(whole) - 12])
    missing = tmp_path / "missing.jsonl"
    return [bad, corrupt, truncated, missing], good


def test_bad_input_is_counted_and_located(bpe_dir, tmp_path, capsys):
    from megatron_biglm.data.preprocess import preprocess

    files, good = _bad_input_files(tmp_path)
    summary = preprocess(files, tmp_path / "out", bpe_dir)
    assert summary["skipped"] == {
        "invalid_json": 1, "missing_key": 2, "empty_document": 2, "invalid_utf8": 1,
        "not_a_string": 1, "not_an_object": 1, "blank_line": 1, "lone_surrogate": 1,
        "unreadable_file": 3}
    bad, corrupt, truncated, missing = map(str, files)
    examples = "\n".join(summary["skipped_examples"])
    for location in [f"{bad}:2: invalid_json", f"{bad}:3: missing_key", f"{bad}:4: empty_document",
                     f"{bad}:6: invalid_utf8", f"{bad}:7: empty_document", f"{bad}:8: not_a_string",
                     f"{bad}:9: not_an_object", f"{bad}:10: blank_line", f"{bad}:11: lone_surrogate",
                     f"{bad}:13: missing_key", f"{corrupt}: unreadable_file",
                     f"{missing}: unreadable_file: does not exist (FileNotFoundError"]:
        assert location in examples
    ended = re.search(re.escape(truncated) + r":(\d+): unreadable_file: truncated after line (\d+) \(EOFError", examples)
    assert ended and int(ended[1]) == int(ended[2]) + 1
    # everything before the truncation point is kept, in order, then the good jsonl lines
    kept = read_back(tmp_path / "out_text_document")
    kept_truncated = len(kept) - 3
    assert 0 < kept_truncated < 400
    assert summary["documents"] == len(kept) and summary["unreadable_files"] == 3
    from megatron_biglm.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(bpe_dir)
    assert kept == expected_ids(tokenizer, good[:3] + [good[3]] * kept_truncated, True)


@pytest.mark.slow  # a real subprocess: imports transformers + megatron, spawns 2 workers
def test_cli_exit_status_and_summary_with_bad_input(bpe_dir, tmp_path):
    files, _ = _bad_input_files(tmp_path)
    command = [sys.executable, "-m", "megatron_biglm.cli.preprocess", "--input",
               *map(str, files), "--output-prefix", str(tmp_path / "out"), "--tokenizer",
               str(bpe_dir), "--workers", "2", "--append-eod"]
    env = dict(os.environ, PYTHONPATH=str(REPO))  # the tool imports the package (installed, or this checkout)
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["skipped"]["invalid_json"] == 1 and last["skipped"]["unreadable_file"] == 3
    assert sum(last["skipped"].values()) == 13
    assert last["documents"] == len(read_back(tmp_path / "out_text_document"))
    assert f"{files[0]}:6: invalid_utf8" in proc.stdout


def test_strict_fails_naming_file_and_line(bpe_dir, tmp_path, capsys):
    files, _ = _bad_input_files(tmp_path)
    tool = load_tool("preprocess")
    rc = tool.main(["--input", str(files[0]), "--output-prefix", str(tmp_path / "out"),
                    "--tokenizer", str(bpe_dir), "--strict", "--quiet"])
    assert rc == 1
    assert f"{files[0]}:2: invalid_json" in capsys.readouterr().err
    assert not [p for p in os.listdir(tmp_path) if p.startswith("out")]  # nothing left behind


def test_fatal_and_usage_exit_codes(bpe_dir, tmp_path, capsys):
    tool = load_tool("preprocess")
    common = ["--output-prefix", str(tmp_path / "out"), "--tokenizer", str(bpe_dir), "--quiet"]
    assert tool.main(["--input", str(tmp_path / "nothing-*.jsonl"), *common]) == 1
    assert "no input files" in capsys.readouterr().err
    (tmp_path / "only.jsonl.gz").write_bytes(b"not gzip")
    assert tool.main(["--input", str(tmp_path / "only.jsonl.gz"), *common]) == 1
    assert "could be read" in capsys.readouterr().err
    whole = gzip.compress(b'{"text": "the rest is silence"}\n' * 300)
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[:-20])  # truncated, but documents survive
    assert tool.main(["--input", str(tmp_path / "cut.jsonl.gz"), *common[:-1], "--quiet"]) == 0
    assert '"unreadable_file": 1' in capsys.readouterr().out
    for ext in (".bin", ".idx"):
        os.remove(tmp_path / f"out_text_document{ext}")
    (tmp_path / "keys.jsonl").write_text('{"body": "x"}\n')
    assert tool.main(["--input", str(tmp_path / "keys.jsonl"), *common]) == 1
    assert "check --json-keys" in capsys.readouterr().err
    (tmp_path / "data.csv").write_text("a,b\n")
    assert tool.main(["--input", str(tmp_path / "data.csv"), *common]) == 2
    assert "cannot tell the format" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        tool.main(["--input", "x.jsonl"])  # missing required arguments
    assert exited.value.code == 2
    assert not [p for p in os.listdir(tmp_path) if p.startswith("out")]


def test_interrupted_run_leaves_no_index_and_keeps_the_old_one(corpus_jsonl, bpe, tmp_path,
                                                              monkeypatch):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from megatron_biglm.data import indexed_tools
    from megatron_biglm.data.preprocess import preprocess

    preprocess([corpus_jsonl], tmp_path / "out", bpe)
    old = {ext: (tmp_path / f"out_text_document{ext}").read_bytes() for ext in (".bin", ".idx")}
    calls = []
    real_add = indexed_tools.AtomicIndexedWriter.add_documents

    def add_then_interrupt(self, tokens, lengths):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real_add(self, tokens, lengths)

    monkeypatch.setattr(indexed_tools.AtomicIndexedWriter, "add_documents", add_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        preprocess([corpus_jsonl], tmp_path / "out", bpe, append_eod=False, batch_size=5)
    assert len(calls) == 3
    assert sorted(os.listdir(tmp_path)) == ["out_text_document.bin", "out_text_document.idx"]
    assert {ext: (tmp_path / f"out_text_document{ext}").read_bytes() for ext in old} == old
    # a writer killed before commit (no cleanup at all) leaves only temporaries
    monkeypatch.undo()
    writer = indexed_tools.AtomicIndexedWriter(str(tmp_path / "killed"), np.uint16)
    writer.add_documents(np.arange(5, dtype=np.uint16), np.array([2, 3]))
    writer.builder.data_file.flush()
    assert not IndexedDataset.exists(str(tmp_path / "killed"))
    assert all(".tmp-" in name for name in os.listdir(tmp_path) if name.startswith("killed"))
    writer.discard()


def test_several_json_keys_give_one_dataset_each(bpe, tmp_path):
    from megatron_biglm.data.preprocess import preprocess

    records = [{"title": "Hamlet", "text": "To be, or not to be"},
               {"title": "Macbeth", "text": "Is this a dagger which I see before me"},
               {"text": "no title here"},
               {"title": "Lear", "text": "Nothing will come of nothing"}]
    path = tmp_path / "plays.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = preprocess([path], tmp_path / "out", bpe, json_keys=("text", "title"), workers=1,
                         batch_size=3)
    assert read_back(tmp_path / "out_text_document") == expected_ids(
        bpe, [r["text"] for r in records], True)
    assert read_back(tmp_path / "out_title_document") == expected_ids(
        bpe, [r["title"] for r in records if "title" in r], True)
    assert summary["skipped"] == {"missing_key": 1}
    assert summary["outputs"]["title"]["documents"] == 3 and summary["documents"] == 7


def _word_level_dir(directory, vocab_size, **kwargs):
    """A WordLevel HF tokenizer of `vocab_size` entries `w0..wN` (any HF tokenizer works)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[SEP]": 1, "[MASK]": 2} | {f"w{i}": i for i in range(3, vocab_size)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(clean_text=True, lowercase=False)
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", sep_token="[SEP]",
                            mask_token="[MASK]", **kwargs).save_pretrained(str(directory))
    return directory


def test_large_vocab_uses_int32_and_keeps_high_ids(tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from megatron_biglm.data.preprocess import preprocess

    directory = _word_level_dir(tmp_path / "tok", 70_000)
    rng = np.random.default_rng(0)
    documents = [[int(i) for i in rng.integers(3, 70_000, size=rng.integers(1, 40))]
                 for _ in range(50)]
    path = tmp_path / "ids.jsonl"
    path.write_text("".join(json.dumps({"text": " ".join(f"w{i}" for i in d)}) + "\n"
                            for d in documents))
    summary = preprocess([path], tmp_path / "out", directory, workers=2, batch_size=8)
    assert summary["dtype"] == "int32"
    assert IndexedDataset(str(tmp_path / "out_text_document")).index.dtype == np.int32
    assert read_back(tmp_path / "out_text_document") == [d + [1] for d in documents]  # EOS = [SEP]


def test_documents_that_encode_to_nothing_are_counted(tmp_path):
    from megatron_biglm.data.preprocess import preprocess

    directory = _word_level_dir(tmp_path / "tok", 50)
    path = tmp_path / "ctrl.jsonl"
    path.write_text(json.dumps({"text": "w5 w6"}) + "\n" + json.dumps({"text": "\x01\x02"}) + "\n")
    summary = preprocess([path], tmp_path / "out", directory, append_eod=False)
    assert summary["skipped"] == {"empty_after_tokenization": 1}
    assert f"{path}:2: empty_after_tokenization" in summary["skipped_examples"][0]
    assert read_back(tmp_path / "out_text_document") == [[5, 6]]


def test_a_dying_worker_is_an_error_not_a_hang(bpe):
    from megatron_biglm.data.preprocess import (PreprocessError, _Batch, _EncoderSpec,
                                                _ordered_encode, _start_workers)

    broken = _EncoderSpec("this is not a tokenizer.json", False, 1, True, "uint16")
    pool = _start_workers(broken, 2)  # each worker's initializer raises
    try:
        with pytest.raises(PreprocessError, match="worker process died"):
            list(_ordered_encode(iter([_Batch(texts=["a"], keys=[0], where=[("f", 1)])] * 3),
                                 broken, pool, 2))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
