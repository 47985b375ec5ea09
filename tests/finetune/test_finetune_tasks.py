"""The task registry agrees with the data schemas, rows of every kind encode through their
kind's `encode` with drops/truncations in the data report, and every task's selection
key is produced by its metrics."""
import json

import pytest

from finetune_fixtures import encode_rows, ids_of, word_tokenizer
from megatron_biglm.finetune.data_files import SCHEMAS, read_rows
from megatron_biglm.finetune.metrics import task_scores
from megatron_biglm.finetune.tasks import TASKS


def test_registry_matches_the_schemas():
    for task in TASKS.values():
        schema = SCHEMAS[task.dataset]
        if task.kind == "verbalizer":
            assert set(task.prompt.fields) <= set(schema.text_fields), task.name
            assert len(task.prompt.label_words) == len(schema.label_names), task.name
        if task.kind in ("verbalizer", "head"):
            assert task.label_field == schema.label_field
    kinds = {t.kind for t in TASKS.values()}
    assert kinds == {"verbalizer", "head", "span", "seq2seq"}


class _NoSynonyms:
    def synsets(self, *args, **kwargs):
        return []


@pytest.mark.parametrize("name", sorted(TASKS))
def test_selection_key_comes_from_the_metrics(name):
    task = TASKS[name]
    if "squad" in task.metrics:
        preds, refs = {"a": "the cat"}, {"a": ["cat"]}
    elif task.kind == "seq2seq":
        preds = refs = ["a cat sat down"]
    else:
        preds, refs = [0, 1, 1], [0, 1, 0]
    scores = task_scores(task.metrics, preds, refs, wordnet=_NoSynonyms())
    assert task.select in scores
    if task.kind == "seq2seq":
        assert scores["rougeL"] == pytest.approx(1.0)
        if "meteor" in scores:   # 4 matches in one chunk: 1 - 0.5 * (1/4)^3
            assert scores["meteor"] == pytest.approx(1 - 0.5 / 64)
            assert scores["bleu"] == pytest.approx(1.0)
    elif task.kind == "span":
        assert scores == {"exact_match": 1.0, "f1": 1.0}
    else:
        assert scores["accuracy"] == pytest.approx(2 / 3)
        if task.select == "macro_f1":   # class 0: 2/(2+1) ; class 1: 2/(2+1)
            assert scores["macro_f1"] == pytest.approx(2 / 3)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_encode_rows_every_kind(tmp_path):
    cb = [{"premise": "the cat sat on the mat all day", "hypothesis": "a cat sat", "label": 2, "idx": 0},
          {"premise": "it rained", "hypothesis": "it was wet", "label": 0, "idx": 1},
          {"premise": "it rained", "label": 0, "idx": 2}]
    rows, report = read_rows([_jsonl(tmp_path / "cb.jsonl", cb)], "super_glue/cb")
    tok = word_tokenizer([r.get("premise", "") + " " + r.get("hypothesis", "") for r in cb]
                         + [TASKS["cb"].prompt.template, "context where is it ? here"])
    # verbalizer: label index i -> label word i (CB neutral = 2 -> "maybe"); a 27-token
    # budget cuts the 8-token premise of row 1 (the prompt's fixed words take 11 + 2 + 1)
    examples = encode_rows(TASKS["cb"], rows, tok, max_length=1 + 5 + 11 + 1 + 1 + 3)
    assert [e.label for e in examples] == [2, 0]
    assert TASKS["cb"].prompt.label_words[examples[0].label] == "maybe"
    assert report.truncated == {}
    examples = encode_rows(TASKS["cb"], rows, tok, max_length=1 + 5 + 11 + 1 + 1 + 3, report=report)
    assert report.truncated == {"premise": 1}
    assert examples[0].input_ids[1:6] == ids_of(tok, "the cat sat on the")
    assert report.counts == {"missing_field": 1}
    # head: the schema's text fields, in order
    head = encode_rows(TASKS["cb_head"], rows, tok, max_length=64)
    assert head[1].input_ids == ([tok.bos_token_id] + ids_of(tok, "it rained") + [tok.eos_token_id]
                                 + ids_of(tok, "it was wet") + [tok.eos_token_id])
    # span: one example per window
    squad = [{"id": "q", "title": "t", "context": "the cat sat on the mat all day",
              "question": "where is it ?", "answers": {"text": ["on the mat"], "answer_start": [12]}}]
    rows, report = read_rows([_jsonl(tmp_path / "squad.jsonl", squad)], "squad")
    windows = encode_rows(TASKS["squad"], rows, tok, max_length=14, doc_stride=2, report=report)
    # head 6 tokens -> 14 - 3 - 4 = 7 context tokens per window, overlap 2: [0,7) [5,8)
    assert [(w.has_answer, w.start_position, w.end_position) for w in windows] == [(True, 9, 11), (False, 0, 0)]
    # seq2seq: source field first, the schema's target field as suffix
    xsum = [{"id": "1", "document": "the cat sat on the mat", "summary": "a cat sat"},
            {"id": "2", "document": "it rained all day", "summary": "it was wet"}]
    rows, report = read_rows([_jsonl(tmp_path / "xsum.jsonl", xsum)], "xsum")
    examples = encode_rows(TASKS["xsum"], rows, tok, max_length=13, max_source_length=5, max_target_length=8,
                           overlong_source="drop", report=report)
    assert len(examples) == 1 and examples[0].split == 5 and examples[0].target_length == 3
    assert report.counts == {"source_too_long": 1} and report.rows_kept == 1
    assert any(line.startswith("xsum:1: source_too_long") for line in report.example_lines())
    with pytest.raises(ValueError, match="max_source_length must be >= 2"):  # 8 - the default 64 target tokens
        encode_rows(TASKS["xsum"], rows, tok, max_length=8)
