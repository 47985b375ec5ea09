"""Local fine-tuning files in HF schemas: every bad row counted by reason, none dropped
silently, the same checks on the hub path (faked: tests never touch a hub)."""
import gzip
import json

import pytest

from megatron_biglm.data.readers import BadInputError
from megatron_biglm.finetune import data_files
from megatron_biglm.finetune.data_files import load_split, read_rows


def _write_jsonl(path, rows, extra_lines=()):
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    data = ("\n".join(lines) + "\n").encode()
    if str(path).endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


CB_ROWS = [
    {"premise": "It rained.", "hypothesis": "It was wet.", "label": 0, "idx": 0},
    {"premise": "It rained.", "hypothesis": "It was dry.", "label": "contradiction", "idx": 1},
    {"premise": "It rained.", "label": 2, "idx": 2},                          # missing_field
    {"premise": "   ", "hypothesis": "x", "label": 2, "idx": 3},              # empty_field
    {"premise": "a", "hypothesis": "b", "label": 7, "idx": 4},                # bad_label
    {"premise": "a", "hypothesis": "b", "label": -1, "idx": 5},               # unlabeled
    {"premise": "a", "hypothesis": "b", "label": "maybe", "idx": 6},          # bad_label
]


def test_cb_rows_counted_by_reason(tmp_path):
    path = _write_jsonl(tmp_path / "cb.jsonl.gz", CB_ROWS, ["{not json", "", "[1, 2]"])
    rows, report = read_rows([path], "super_glue/cb")
    assert rows == [
        {"premise": "It rained.", "hypothesis": "It was wet.", "label": 0, "idx": 0},
        {"premise": "It rained.", "hypothesis": "It was dry.", "label": 1, "idx": 1},
    ]
    assert report.as_dict() == {
        "rows_seen": 10, "rows_kept": 2, "truncated": {},
        "dropped": {"bad_label": 2, "blank_line": 1, "empty_field": 1, "invalid_json": 1,
                    "missing_field": 1, "not_an_object": 1, "unlabeled": 1}}
    assert report.rows_seen == report.rows_kept + report.rows_dropped
    assert any("cb.jsonl.gz:3: missing_field" in line for line in report.example_lines())
    assert report.summary_line().startswith("rows 10: kept 2, dropped 8 (")
    # unlabeled test rows are kept on request, with label None
    rows, report = read_rows([path], "super_glue/cb", require_labels=False)
    assert [r["label"] for r in rows] == [0, 1, None] and "unlabeled" not in report.counts


def test_strict_raises_at_the_first_bad_row(tmp_path):
    path = _write_jsonl(tmp_path / "cb.jsonl", CB_ROWS)
    with pytest.raises(BadInputError, match=r"cb.jsonl:3: missing_field"):
        read_rows([path], "super_glue/cb", strict=True)


def test_squad_xsum_msqg_schemas(tmp_path):
    context = "The cat sat on the mat."
    squad = [
        {"id": "a", "title": "t", "context": context, "question": "Where?",
         "answers": {"text": ["on the mat"], "answer_start": [8]}},
        {"id": "b", "title": "t", "context": context, "question": "Who?",
         "answers": {"text": [], "answer_start": []}},                          # bad_answers
        {"id": "c", "title": "t", "context": context, "question": "Who?",
         "answers": {"text": ["cat", "the cat"], "answer_start": [4]}},          # bad_answers
        {"id": "d", "title": "t", "context": context, "question": "",
         "answers": {"text": ["cat"], "answer_start": [4]}},                     # empty_field
    ]
    rows, report = read_rows([_write_jsonl(tmp_path / "squad.jsonl", squad)], "squad")
    assert [r["id"] for r in rows] == ["a"] and rows[0]["answers"]["answer_start"] == [8]
    assert report.as_dict()["dropped"] == {"bad_answers": 2, "empty_field": 1}
    xsum = [{"id": "1", "document": "Long text.", "summary": "Short."},
            {"id": "2", "document": "Long text.", "summary": ""},               # empty_target
            {"id": "3", "document": "", "summary": "x"}]                        # empty_field
    rows, report = read_rows([_write_jsonl(tmp_path / "xsum.jsonl", xsum)], "xsum")
    assert [r["id"] for r in rows] == ["1"]
    assert report.as_dict()["dropped"] == {"empty_field": 1, "empty_target": 1}
    msqg = [{"source": "answer [SEP] passage", "target": "question?"}, {"source": "s", "target": "  "}]
    rows, report = read_rows([_write_jsonl(tmp_path / "msqg.jsonl", msqg)], "msqg")
    assert rows == [{"source": "answer [SEP] passage", "target": "question?"}]
    assert report.counts == {"empty_target": 1}


def test_parquet_with_nested_answers(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.Table.from_pylist([
        {"id": "a", "title": "t", "context": "The cat sat.", "question": "Who?",
         "answers": {"text": ["cat"], "answer_start": [4]}},
        {"id": "b", "title": "t", "context": None, "question": "Who?",
         "answers": {"text": ["cat"], "answer_start": [4]}},
    ])
    pq.write_table(table, tmp_path / "squad.parquet")
    rows, report = read_rows([tmp_path / "squad.parquet"], "squad")
    assert rows[0]["answers"] == {"text": ["cat"], "answer_start": [4]} and len(rows) == 1
    assert report.counts == {"missing_field": 1} and report.rows_seen == 2


def test_hub_path_applies_the_same_checks(monkeypatch):
    calls = []

    def fake_load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        return [{"question": "is it?", "passage": "yes it is", "label": True, "idx": 0},
                {"question": "", "passage": "p", "label": 0, "idx": 1}]

    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    rows, report = load_split("super_glue/boolq", split="validation")
    assert calls == [("super_glue", "boolq", "validation")]
    assert rows == [{"question": "is it?", "passage": "yes it is", "label": 1, "idx": 0}]
    assert report.counts == {"empty_field": 1}
    assert "super_glue/boolq[validation]:2" in report.example_lines()[0]


def test_usage_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown data set"):
        read_rows([tmp_path / "x.jsonl"], "glue/nope")
    with pytest.raises(ValueError, match="give local `files`"):
        load_split("xsum")
    with pytest.raises(BadInputError, match=r"missing\.jsonl: unreadable_file: does not exist: give an existing file"):
        read_rows([tmp_path / "missing.jsonl"], "xsum")
    rows, report = read_rows([tmp_path / "missing.jsonl"], "xsum", skip_unreadable=True)
    assert rows == [] and report.counts == {"unreadable_file": 1} and report.rows_dropped == 0
    assert set(data_files.SCHEMAS) >= {"glue/mnli", "super_glue/boolq", "super_glue/cb",
                                       "super_glue/copa", "super_glue/rte", "super_glue/wic",
                                       "squad", "xsum", "msqg"}


def test_a_directory_lists_every_data_format_and_names_what_it_ignores(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    from megatron_biglm.finetune.tasks import get_task
    from megatron_biglm.finetune.tasks.declaration import with_labels

    folder = tmp_path / "train"
    folder.mkdir()
    (folder / "a.jsonl").write_text(json.dumps({"text": "one", "label": "pos"}) + "\n")
    (folder / "b.csv").write_text("text,label\ntwo,neg\n")
    (folder / "c.tsv.gz").write_bytes(gzip.compress(b"text\tlabel\nthree\tpos\n"))
    (folder / "d.csv.zst").write_bytes(zstandard.ZstdCompressor().compress(b"text,label\nfour,neg\n"))
    pq.write_table(pa.Table.from_pylist([{"text": "five", "label": "pos"}]), folder / "e.parquet")
    (folder / "NOTES.txt").write_text("my notes")
    task, _ = with_labels(get_task({"kind": "head", "fields": ["text"]}), str(folder))
    rows, report = load_split(task.dataset, files=[str(folder)])
    assert [r["text"] for r in rows] == ["one", "two", "three", "four", "five"]
    assert report.summary_line().endswith(f"; ignored 1 file(s) of no data format in its directories "
                                          f"({folder / 'NOTES.txt'})")
    only_csv = tmp_path / "csv_only"
    only_csv.mkdir()
    (only_csv / "x.csv").write_text("text,label\nsix,pos\nseven,neg\n")
    data_files.check_split_files({"train": str(only_csv)}, ["train"])
    assert len(load_split(task.dataset, files=[str(only_csv)])[0]) == 2


@pytest.mark.parametrize("name,content,says", [
    ("t.csv", b"", r"t\.csv: the file is empty \(no lines\)"),
    ("t.csv", b"text,label\n", r"t\.csv: the file holds only a header \(text, label\) and no rows"),
    ("t.csv", "text,label\ncaf\xe9,pos\nna\xefve,neg\n".encode("latin-1"),
     r"t\.csv: no row could be read \(invalid_utf8 2\); the file is not UTF-8 \(latin-1 or cp1252\?\): save it as UTF-8"),
    ("t.jsonl", b'{"text": "a", "label"\n{oops\n', r"t\.jsonl: no row could be read \(invalid_json 2\)"),
    ("t.jsonl", b"\n \n", r"t\.jsonl: the file holds only blank lines \(2\)"),
])
def test_a_file_without_rows_says_why_instead_of_blaming_the_label_column(name, content, says, tmp_path):
    from megatron_biglm.finetune.tasks import get_task
    from megatron_biglm.finetune.tasks.declaration import TaskDeclarationError, with_labels

    (tmp_path / name).write_bytes(content)
    with pytest.raises(TaskDeclarationError, match=r"the training split has no row to infer labels from: \S+" + says):
        with_labels(get_task({"kind": "head", "fields": ["text"]}), str(tmp_path / name))
