"""Tokenizer training on a sample: the draw is reproducible per seed, spans the files, respects
its limits, and equals the reference (every document sorted by priority, longest prefix
within the limits); python -m megatron_biglm.cli.train_tokenizer trains on it and reports it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from preprocess_fixtures import load_tool


@pytest.fixture(scope="module")
def three_files(corpus_jsonl, tmp_path_factory) -> Path:
    lines = Path(corpus_jsonl).read_text("utf-8").splitlines(keepends=True)
    folder = tmp_path_factory.mktemp("sample")
    third = len(lines) // 3
    for i, chunk in enumerate((lines[:third], lines[third:2 * third], lines[2 * third:])):
        (folder / f"f{i}.jsonl").write_text("".join(chunk), encoding="utf-8")
    return folder


def _reference(folder: Path, seed: int, max_documents=None, max_bytes=None) -> list[str]:
    """All documents ranked by priority; the longest prefix within the limits; corpus order."""
    from megatron_biglm.data.text_sample import priority

    documents = []
    for path in sorted(folder.glob("*.jsonl")):
        for line, raw in enumerate(path.read_text("utf-8").splitlines(), start=1):
            text = json.loads(raw)["text"]
            documents.append((priority(seed, path, line, "text"), str(path), line, text))
    chosen, total = [], 0
    for document in sorted(documents):
        size = len(document[3].encode("utf-8"))
        if (max_documents and len(chosen) + 1 > max_documents) or (max_bytes and total + size > max_bytes):
            break
        chosen.append(document)
        total += size
    return [d[3] for d in sorted(chosen, key=lambda d: (d[1], d[2]))]


def _sample(folder, **limits):
    from megatron_biglm.data.readers import SkipReport
    from megatron_biglm.data.text_sample import sample_texts

    return sample_texts([str(folder / "*.jsonl")], report=SkipReport(), **limits)


def test_sample_is_reproducible_per_seed_and_matches_the_reference(three_files):
    first = _sample(three_files, max_documents=12, seed=1)
    assert first.texts == _sample(three_files, max_documents=12, seed=1).texts
    assert first.texts == _reference(three_files, 1, max_documents=12)
    assert len(first.texts) == 12 and first.files_sampled == 3 == first.files_seen
    other = _sample(three_files, max_documents=12, seed=2)
    assert other.texts != first.texts and other.texts == _reference(three_files, 2, max_documents=12)

    budget = first.bytes_seen // 5
    by_bytes = _sample(three_files, max_bytes=budget, seed=1)
    assert by_bytes.texts == _reference(three_files, 1, max_bytes=budget)
    assert 0 < by_bytes.bytes == sum(len(t.encode()) for t in by_bytes.texts) <= budget
    both = _sample(three_files, max_documents=3, max_bytes=budget, seed=1)
    assert both.texts == _reference(three_files, 1, max_documents=3, max_bytes=budget)
    with pytest.raises(ValueError, match="no document fits"):
        _sample(three_files, max_bytes=1, seed=1)


def test_train_tokenizer_cli_trains_on_the_sample_and_reports_it(three_files, tmp_path, capsys):
    tool = load_tool("train_tokenizer")
    argv = ["--input", str(three_files / "*.jsonl"), "--vocab-size", "300", "--sample-docs", "8",
            "--seed", "5"]
    assert tool.main(argv + ["--output", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    sample = json.loads(out.strip().splitlines()[-1])["sample"]
    seen = sample["documents_seen"]
    assert f"sampled 8 of {seen:,} documents" in out and "(seed 5; at most 8 documents)" in out
    assert sample["documents"] == 8 and sample["bytes"] == sum(
        len(t.encode()) for t in _reference(three_files, 5, max_documents=8))
    assert tool.main(argv + ["--output", str(tmp_path / "b")]) == 0
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()
    capsys.readouterr()
    assert tool.main(argv[:-4] + ["--sample-bytes", "1", "--output", str(tmp_path / "c")]) == 1
    assert "no document fits" in capsys.readouterr().err
