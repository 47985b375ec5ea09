"""Tasks declared in config (finetune/tasks/declaration.py): a declaration of a built-in task's
columns reads and encodes exactly what the built-in does, labels are inferred from the training
split, a byte-order mark is accepted in csv and jsonl, and bad declarations name the key."""
from __future__ import annotations

import json

import pytest

from finetune_fixtures import encode_rows, word_tokenizer
from megatron_biglm.finetune.data_files import load_split
from megatron_biglm.finetune.tasks import DECLARATIONS, TASKS, get_task
from megatron_biglm.finetune.tasks.declaration import TaskDeclarationError, declare_task, with_labels

CB_ROWS = [{"premise": "It rained all day .", "hypothesis": "The street is wet .", "label": i % 3, "idx": i}
           for i in range(9)]


def write(path, text: str, bom: bool = False):
    path.write_bytes(("\ufeff" if bom else "").encode() + text.encode())
    return str(path)


def test_every_built_in_task_is_its_declaration():
    for name, spec in DECLARATIONS.items():
        assert declare_task(spec) == TASKS[name], name


def test_a_user_declaration_of_cb_encodes_what_the_built_in_does(tmp_path):
    path = write(tmp_path / "cb.jsonl", "".join(json.dumps(r) + "\n" for r in CB_ROWS))
    builtin = TASKS["cb"]
    mine = get_task({"kind": "verbalizer", "template": builtin.prompt.template, "label_field": "label",
                     "labels": ["entailment", "contradiction", "neutral"],
                     "label_words": dict(zip(["entailment", "contradiction", "neutral"], builtin.prompt.label_words))})
    tok = word_tokenizer([" ".join(r["premise"] + " " + r["hypothesis"] for r in CB_ROWS) +
                          " Question: Yes, no, or maybe? Answer: yes no maybe"])
    rows_b, _ = load_split(builtin.dataset, files=[path])
    rows_m, _ = load_split(mine.dataset, files=[path])
    assert [r["label"] for r in rows_b] == [r["label"] for r in rows_m] == [i % 3 for i in range(9)]
    enc_b = encode_rows(builtin, rows_b, tok, max_length=64)
    enc_m = encode_rows(mine, rows_m, tok, max_length=64)
    assert [(e.input_ids, e.label, e.split) for e in enc_b] == [(e.input_ids, e.label, e.split) for e in enc_m]


def test_labels_are_inferred_sorted_from_the_training_split_and_a_bom_is_accepted(tmp_path):
    csv = write(tmp_path / "t.csv", "text,tag\nb c,zeta\na,alpha\nc,zeta\n", bom=True)
    task, note = with_labels(get_task({"kind": "head", "fields": ["text"], "label_field": "tag"}), csv)
    assert task.dataset.label_names == ("alpha", "zeta") and note.endswith("0: alpha, 1: zeta")
    rows, report = load_split(task.dataset, files=[csv])
    assert [r["tag"] for r in rows] == [1, 0, 1] and [r["text"] for r in rows] == ["b c", "a", "c"]
    assert report.rows_kept == 3 and not report.counts  # the BOM did not eat the header's first name
    jsonl = write(tmp_path / "t.jsonl", '{"text": "a", "tag": "zeta"}\n', bom=True)
    assert load_split(task.dataset, files=[jsonl])[0] == [{"text": "a", "tag": 1}]
    multi = write(tmp_path / "m.csv", "text,tags\na,x\nb,\"y,x\"\nc,\n")
    task, _ = with_labels(get_task({"kind": "head", "fields": ["text"], "label_field": "tags",
                                    "problem_type": "multi_label_classification"}), multi)
    rows, _ = load_split(task.dataset, files=[multi])
    assert task.dataset.label_names == ("x", "y") and [r["tags"] for r in rows] == [(0,), (0, 1), ()]


def test_regression_labels_are_numbers_and_a_bad_one_is_dropped_by_line(tmp_path):
    csv = write(tmp_path / "r.csv", "text,score\na,1.5\nb,high\nc,-2\n")
    task = get_task({"kind": "head", "fields": ["text"], "label_field": "score", "problem_type": "regression"})
    rows, report = load_split(task.dataset, files=[csv])
    assert [r["score"] for r in rows] == [1.5, -2.0] and report.counts["bad_label"] == 1
    assert "r.csv:3: bad_label: score='high' is not a number" in report.example_lines()[0]


@pytest.mark.parametrize("spec, says", [
    ({"kind": "head"}, r"finetune\.task\.fields: name the text column"),
    ({"kind": "nope", "fields": ["t"]}, r"finetune\.task\.kind must be one of"),
    ({"kind": "verbalizer", "template": "{t} <mask>", "label_words": ["a", "b"]}, r"label_words as a list needs labels"),
    ({"kind": "verbalizer", "template": "{t}", "label_words": {"x": "a", "y": "b"}}, r"needs exactly one <mask>"),
    ({"kind": "head", "fields": ["t"], "problem_type": "regression", "labels": ["a"]}, r"regression task has a number"),
    ({"kind": "head", "fields": ["t"], "metrics": ["accuracy"], "select": "f1"}, r"select='f1' is not a score"),
    ({"kind": "head", "fields": ["t"], "metrics": ["acuracy"]}, r"unknown metric 'acuracy'"),
])
def test_bad_declarations_name_the_key(spec, says):
    with pytest.raises((TaskDeclarationError, ValueError), match=says):
        declare_task(spec)


def test_a_user_metric_function_is_scored_and_selectable():
    from megatron_biglm.finetune.metrics.task_scores import score_keys, task_scores

    task = declare_task({"kind": "head", "fields": ["t"], "metrics": ["accuracy", "statistics:fmean"],
                         "select": "fmean"})
    assert task.select == "fmean" and score_keys(task.metrics) == ["accuracy", "fmean"]
    # statistics.fmean(predictions, references) is the weighted mean: a real function of both
    scores = task_scores(task.metrics, [1.0, 3.0], [1.0, 3.0])
    assert scores == {"accuracy": 1.0, "fmean": pytest.approx((1 * 1 + 3 * 3) / 4)}
