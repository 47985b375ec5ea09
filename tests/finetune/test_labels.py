"""The one label rule (finetune/labels.py): a label is its value in every format; a column of
mixed kinds, of mappings or of lists is refused naming what it holds."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from megatron_biglm.finetune.data_files import load_split
from megatron_biglm.finetune.tasks import get_task
from megatron_biglm.finetune.tasks.declaration import TaskDeclarationError, with_labels

HEAD = {"kind": "head", "fields": ["text"]}


def write(path, labels):
    """Rows "row i" with the given label cells, in the format the file name says."""
    rows = [{"text": f"row {i}", "label": v} for i, v in enumerate(labels)]
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        sep = "\t" if path.suffix == ".tsv" else ","
        path.write_text(f"text{sep}label\n" + "".join(f"{r['text']}{sep}{r['label']}\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("name,labels", [("t.csv", ["0", "1", "0.0", "1.0", " 1 ", "0.00"]),
                                         ("t.tsv", ["0", "1", "0.0", "1.0", "1e0", "0"]),
                                         ("t.jsonl", [0, 1, 0.0, 1.0, "1.0", "0"]),
                                         ("t.parquet", [0.0, 1.0, 0.0, 1.0, 1.0, 0.0])])
def test_zero_and_zero_point_zero_are_one_label_in_every_format(name, labels, tmp_path):
    path = write(tmp_path / name, labels)
    task, note = with_labels(get_task(HEAD), path)
    assert task.dataset.label_names == ("0", "1"), note
    rows, report = load_split(task.dataset, files=[path])
    assert report.rows_kept == 6
    assert [r["label"] for r in rows] == [round(float(v)) for v in labels]


@pytest.mark.parametrize("labels,says", [
    ([1, True, 0, False, 1], r"mixes kinds of labels \(booleans 'True' x1, 'False' x1; numbers '1' x2, '0' x1\)"),
    (["0", "pos", "neg", "pos"], r"mixes kinds of labels \(names 'pos' x2, 'neg' x1; numbers '0' x1\)"),
])
def test_labels_of_mixed_kinds_are_refused_with_values_and_counts_unless_listed(labels, says, tmp_path):
    path = write(tmp_path / "t.jsonl", labels)
    with pytest.raises(TaskDeclarationError, match=says + r".*list every label in finetune\.task\.labels"):
        with_labels(get_task(HEAD), path)
    listed = sorted({str(v) for v in labels})
    task, note = with_labels(get_task({**HEAD, "labels": listed}), path)
    assert note is None
    rows, report = load_split(task.dataset, files=[path])
    assert report.rows_kept == len(labels)


def test_mapping_labels_are_named_as_mappings(tmp_path):
    path = write(tmp_path / "t.jsonl", [{"name": "pos"}, {"name": "neg"}, {"name": "pos"}])
    with pytest.raises(TaskDeclarationError, match=r"'label' column holds mappings \(3 rows, e\.g\. \{'name': 'pos'\}\)"
                                                  r".*set finetune\.task\.label_field"):
        with_labels(get_task(HEAD), path)


def test_list_labels_suggest_multi_label_classification(tmp_path):
    path = write(tmp_path / "t.jsonl", [["a", "b"], ["b"], ["a"]])
    with pytest.raises(TaskDeclarationError, match=r"'label' column holds lists \(3 rows.*"
                                                  r"problem_type: multi_label_classification"):
        with_labels(get_task(HEAD), path)
    task, _ = with_labels(get_task({**HEAD, "problem_type": "multi_label_classification"}), path)
    assert task.dataset.label_names == ("a", "b")
