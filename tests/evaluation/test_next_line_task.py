"""The quickstart's next-line task: every answer really is the next line, distractors are not."""
import json

import pytest

from megatron_biglm.evaluation.next_line_task import next_line_questions, verse_lines, write_next_line_task


def _docs(corpus_jsonl):
    return [json.loads(line)["text"] for line in open(corpus_jsonl, encoding="utf-8")]


def test_answers_follow_their_question_in_the_text(corpus_jsonl):
    docs = _docs(corpus_jsonl)
    following = {}
    for doc in docs:
        lines = verse_lines(doc)
        for a, b in zip(lines, lines[1:]):
            following.setdefault(a, set()).add(b)
    questions = next_line_questions(docs, 200, n_choices=4, seed=3)
    assert len(questions) == 200
    for q in questions:
        texts, labels = q["choices"]["text"], q["choices"]["label"]
        assert labels == ["A", "B", "C", "D"] and len(set(texts)) == 4
        answer = texts[labels.index(q["answerKey"])]
        assert answer in following[q["question"]]
        assert q["question"] not in texts
    # The answer's position is spread over the labels, not stuck at one.
    keys = [q["answerKey"] for q in questions]
    assert min(keys.count(k) for k in "ABCD") > 200 / 4 * 0.6


def test_seeded_and_written_in_arc_schema(corpus_jsonl, tmp_path):
    docs = _docs(corpus_jsonl)
    assert next_line_questions(docs, 20, seed=1) == next_line_questions(docs, 20, seed=1)
    assert next_line_questions(docs, 20, seed=1) != next_line_questions(docs, 20, seed=2)
    path = write_next_line_task(docs, tmp_path, n_questions=20, seed=1)
    assert path.name == "arc_easy.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == next_line_questions(docs, 20, seed=1)


def test_refuses_more_questions_than_the_text_holds():
    with pytest.raises(ValueError, match="line pairs"):
        next_line_questions(["one two three four\nfive six seven eight"], 5)
    with pytest.raises(ValueError, match="n_choices"):
        next_line_questions(["x"], 1, n_choices=9)


def test_quickstart_task_config_scores_the_lines_as_they_stand(corpus_jsonl, tmp_path):
    """The quickstart's lm-eval task: context is the line itself, each candidate follows it
    after a newline (as in the text), and acc_mutual_info is computed beside acc/acc_norm."""
    from lm_eval.tasks import get_task_dict

    from megatron_biglm.evaluation.next_line_task import write_next_line_task_yaml
    from megatron_biglm.evaluation.tasks import local_task_manager

    docs = _docs(corpus_jsonl)
    write_next_line_task(docs, tmp_path / "data", n_questions=5, seed=1)
    write_next_line_task_yaml(tmp_path / "data", tmp_path / "yaml")
    task = get_task_dict(["arc_easy"], local_task_manager(tmp_path / "yaml"))["arc_easy"]
    doc = next(iter(task.eval_docs))
    question = next_line_questions(docs, 5, seed=1)[0]
    assert task.doc_to_text(doc) == question["question"]
    assert task.config.target_delimiter == "\n"
    assert task.doc_to_choice(doc) == question["choices"]["text"]
    assert {m["metric"] for m in task.config.metric_list} == {"acc", "acc_norm", "acc_mutual_info"}
