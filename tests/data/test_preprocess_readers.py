"""Readers: documents come out exactly as written, in order, for every format; each bad
input is counted once with its location; nothing else is dropped."""
from __future__ import annotations

import gzip
import json
import string

import numpy as np
import pytest

from megatron_biglm.data.readers import (BadInputError, SkipReport, expand_inputs, input_format,
                                         iter_records, iter_texts)


def _random_text(rng) -> str:
    alphabet = string.ascii_letters + string.digits + " \t\n.,;'\"\\{}[]" + "éßжλ中文😀\u00a0\u2028"
    n = int(rng.integers(1, 200))
    text = "".join(rng.choice(list(alphabet), size=n))
    return text if text.strip() else text + "x"


def test_jsonl_documents_survive_exactly_over_random_draws(tmp_path):
    for seed in range(20):
        rng = np.random.default_rng(seed)
        texts = [_random_text(rng) for _ in range(int(rng.integers(1, 30)))]
        path = tmp_path / f"r{seed}.jsonl{'.gz' if seed % 2 else ''}"
        payload = "".join(json.dumps({"text": t}, ensure_ascii=bool(seed % 3)) + "\n" for t in texts)
        opener = gzip.open if seed % 2 else open
        with opener(path, "wt", encoding="utf-8") as fh:
            fh.write(payload)
        report = SkipReport()
        assert list(iter_texts([path], report=report)) == texts
        assert report.total == 0 and report.files_seen == 1


def test_block_mode_splits_on_blank_lines_only(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"first line\nsecond line\n\n  \t\n\nthird\r\nfourth\r\n\r\n"
                     b"bad \xff byte\nsame block\n\n  indented last")
    report = SkipReport()
    records = list(iter_records([path], report=report))
    assert [r.texts["text"] for r in records] == ["first line\nsecond line", "third\r\nfourth",
                                                  "  indented last"]
    assert [r.line for r in records] == [1, 6, 12]
    assert report.as_dict() == {"invalid_utf8": 1}
    assert report.example_lines()[0].startswith(f"{path}:9: invalid_utf8")


def test_file_mode_and_its_bad_inputs(tmp_path):
    (tmp_path / "a.txt").write_text("whole\n\nfile\n\n")
    (tmp_path / "b.txt").write_text(" \n\n")
    (tmp_path / "c.txt").write_bytes(b"ok line\nline two \xc3\x28 broken\n")
    report = SkipReport()
    texts = list(iter_texts([tmp_path / "*.txt"], report=report, text_mode="file"))
    assert texts == ["whole\n\nfile"]
    assert report.as_dict() == {"empty_document": 1, "invalid_utf8": 1}
    assert f"{tmp_path / 'c.txt'}:2: invalid_utf8" in "\n".join(report.example_lines())


def test_parquet_nulls_binary_and_missing_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a b", None, "", "c d"], "n": [1, 2, 3, 4]}),
                   tmp_path / "s.parquet")
    pq.write_table(pa.table({"text": pa.array([b"bytes ok", b"\xff\xfe"], pa.binary())}),
                   tmp_path / "b.parquet")
    pq.write_table(pa.table({"body": ["x", "y", "z"]}), tmp_path / "m.parquet")
    report = SkipReport()
    records = list(iter_records([tmp_path / "s.parquet", tmp_path / "b.parquet",
                                 tmp_path / "m.parquet"], report=report))
    assert [(r.line, r.texts["text"]) for r in records] == [(1, "a b"), (4, "c d"), (1, "bytes ok")]
    assert report.as_dict() == {"missing_key": 4, "empty_document": 1, "invalid_utf8": 1}
    assert any("no column 'text'" in line for line in report.example_lines())


def test_zstd_frames_and_truncation(tmp_path):
    import zstandard

    lines = [json.dumps({"text": f"doc {i}"}) + "\n" for i in range(100)]
    frames = [zstandard.ZstdCompressor().compress("".join(lines[i:i + 10]).encode())
              for i in range(0, 100, 10)]
    (tmp_path / "ok.jsonl.zst").write_bytes(b"".join(frames))
    data = b"".join(frames)
    report = SkipReport()
    assert list(iter_texts([tmp_path / "ok.jsonl.zst"], report=report)) == [f"doc {i}" for i in range(100)]
    boundaries = np.cumsum([len(f) for f in frames])
    cuts = set(range(len(frames[0]) // 2, len(data), 23)) | set(boundaries[:-1].tolist())
    for cut in sorted(cuts):  # inside frames and between them
        (tmp_path / "cut.jsonl.zst").write_bytes(data[:cut])
        report = SkipReport()
        kept = list(iter_texts([tmp_path / "cut.jsonl.zst"], report=report))
        assert kept == [f"doc {i}" for i in range(len(kept))]
        if cut in boundaries:  # a whole number of frames is a valid, shorter file
            assert report.total == 0 and len(kept) == 10 * (list(boundaries).index(cut) + 1)
        else:
            assert report.counts["unreadable_file"] == 1 and report.files_failed == 1
            assert "ends inside a frame" in report.example_lines()[-1]


def test_expand_inputs_globs_dirs_and_duplicates(tmp_path):
    for name in ["b.jsonl", "a.jsonl", "sub/c.txt", "sub/notes.csv"]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("{}\n")
    report = SkipReport()
    files = expand_inputs([tmp_path / "*.jsonl", tmp_path / "a.jsonl", tmp_path / "sub",
                           tmp_path / "none-*.jsonl"], report)
    assert files == [tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "sub" / "c.txt"]
    assert report.as_dict() == {"unmatched_pattern": 1}
    with pytest.raises(ValueError, match="cannot tell the format"):
        input_format(tmp_path / "sub" / "notes.csv")
    assert input_format("x.CSV", "jsonl") == "jsonl"
    assert [input_format(n) for n in ("a.json.gz", "a.parquet", "b.md.zst")] == ["jsonl", "parquet", "text"]


def test_skip_report_keeps_first_examples_and_strict_raises():
    report = SkipReport(max_examples=2)
    for line in range(1, 6):
        report.skip("invalid_json", "f.jsonl", line, "boom")
    report.skip("missing_key", "f.jsonl", 9, count=3)
    assert report.as_dict() == {"invalid_json": 5, "missing_key": 3} and report.total == 8
    assert report.example_lines() == ["f.jsonl:1: invalid_json: boom", "f.jsonl:2: invalid_json: boom",
                                      "f.jsonl:9: missing_key"]
    assert report.summary_line() == "skipped 8 (invalid_json 5, missing_key 3)"
    with pytest.raises(BadInputError, match=r"^g.jsonl:7: blank_line"):
        SkipReport(strict=True).skip("blank_line", "g.jsonl", 7)


def test_multiple_keys_reject_plain_text_inputs(tmp_path):
    (tmp_path / "a.txt").write_text("x\n")
    with pytest.raises(ValueError, match="plain-text inputs hold one field"):
        list(iter_records([tmp_path / "a.txt"], json_keys=("text", "title"), report=SkipReport()))
