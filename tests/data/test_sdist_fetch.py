"""The BIG-bench extraction on a small hand-built sdist: only the wanted task files are
unpacked, once, and bad examples are counted, not dropped silently."""
import io
import json
import tarfile

import pytest

from megatron_biglm.data.sample_corpus import CorpusUnavailable
from megatron_biglm.experiments import bigbench_data
from megatron_biglm.finetune.row_report import RowReport
from megatron_biglm.data.sdist_fetch import fetch_members

XSUM = {"examples": [
    {"input": "Article one.", "target": "Summary one.", "comment": "xsum-test-0"},
    {"input": "Article two.", "target": "", "comment": "xsum-test-1"},       # empty target
    {"input": "", "target": "Summary three.", "comment": "xsum-test-2"},     # no article
    {"input": "Article four.", "target": "Summary four.", "comment": "xsum-test-3"},
]}
NI = {"task_prefix": "Definition: answer it. ", "description": "d", "examples": [
    {"input": "Q1", "target": ["A1", "A1b"]},
    {"input": "Q2", "target": []},                                            # no target
    {"input": "Q3", "target": "A3"},
]}


def _sdist(path):
    files = {
        "bigbench-1.0.0/bigbench/benchmark_tasks/gem/xsum/task.json": XSUM,
        "bigbench-1.0.0/bigbench/benchmark_tasks/gem/asset/task.json": {"examples": []},
        "bigbench-1.0.0/bigbench/benchmark_tasks/natural_instructions/task.json": {"name": "top"},
        "bigbench-1.0.0/bigbench/benchmark_tasks/natural_instructions/subtask001_x/task.json": NI,
        "bigbench-1.0.0/setup.py": "print()",
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, content in files.items():
            data = (content if isinstance(content, str) else json.dumps(content)).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_extracts_wanted_tasks_once_and_counts_bad_examples(tmp_path, monkeypatch):
    sdist = _sdist(tmp_path / "bigbench-1.0.0.tar.gz")
    monkeypatch.setenv("BIGLM_BIGBENCH_SDIST", str(sdist))
    monkeypatch.setenv("BIGLM_BIGBENCH_DIR", str(tmp_path / "cache"))
    root = bigbench_data.fetch()
    kept = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert kept == [".complete", "gem/xsum/task.json", "natural_instructions/subtask001_x/task.json"]
    report = RowReport()
    rows = list(bigbench_data.xsum_rows(report=report))
    assert [r["id"] for r in rows] == ["xsum-test-0", "xsum-test-3"]
    assert rows[0] == {"id": "xsum-test-0", "document": "Article one.", "summary": "Summary one."}
    assert report.as_dict() == {"rows_seen": 4, "rows_kept": 2, "truncated": {},
                                "dropped": {"empty_target": 1, "missing_field": 1}}
    report = RowReport()
    rows = list(bigbench_data.instruction_rows(report=report))
    assert rows == [
        {"task": "subtask001_x", "instruction": "Definition: answer it.", "input": "Q1",
         "output": "A1", "outputs": ["A1", "A1b"]},
        {"task": "subtask001_x", "instruction": "Definition: answer it.", "input": "Q3",
         "output": "A3", "outputs": ["A3"]}]
    assert report.counts == {"empty_target": 1}
    # cached: a second fetch reads neither the sdist nor pip
    sdist.unlink()
    assert bigbench_data.fetch() == root


def test_unreadable_or_empty_sdist_is_reported(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tar")
    with pytest.raises(CorpusUnavailable, match="unreadable"):
        fetch_members("x==1", tmp_path / "a", lambda name: name, sdist=bad)
    with pytest.raises(CorpusUnavailable, match="no wanted member"):
        fetch_members("x==1", tmp_path / "b", lambda name: None, sdist=_sdist(tmp_path / "s.tar.gz"))
    assert not (tmp_path / "b" / ".complete").exists()
