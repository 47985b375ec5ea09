"""The zero-shot command's checks before the model loads (`evaluation/zero_shot_args.py`) and the
answer rules of local rows (`evaluation/task_data_check.py`): model arguments parse as lm-eval
parses them, and every refusal names the argument or the row."""
from __future__ import annotations

import json

import pytest
from eval_fixtures import task_docs
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_biglm.evaluation.task_data_check import ANSWERS, BadTaskData, check_task_file
from megatron_biglm.evaluation.tasks import PAPER_SUITE, check_task_names
from megatron_biglm.evaluation.zero_shot_args import (BadArguments, check_limit, check_model_arguments,
                                                      model_argument_names)

FREE_KEYS = ["device", "dtype", "split_attention", "prefix_cache", "add_eos", "max_length", "cache_layout"]
VALUES = st.text(st.characters(whitelist_categories=("L", "N"), whitelist_characters="_-."), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(args=st.dictionaries(st.sampled_from(FREE_KEYS), VALUES, max_size=5), spaces=st.booleans())
def test_model_arguments_parse_as_lm_eval_parses_them(tmp_path_factory, args, spaces):
    from lm_eval.utils import simple_parse_args_string

    model = tmp_path_factory.getbasetemp()
    parts = [f"path={model}"] + [f"{k}={v}" for k, v in args.items()]
    text = (", " if spaces else ",").join(parts)
    if spaces and args:  # lm-eval would hand the model a key ' device'
        with pytest.raises(BadArguments, match="lm-eval keeps the spaces around a key"):
            check_model_arguments(text)
        return
    parsed = check_model_arguments(text)
    assert parsed == {"path": str(model), **args}
    assert set(simple_parse_args_string(text)) == set(parsed)


@settings(max_examples=40, deadline=None)
@given(part=st.text(st.characters(blacklist_characters=",=", blacklist_categories=("Cs",)), min_size=1)
       .filter(lambda s: s.strip()))
def test_a_model_argument_without_a_key_is_refused_naming_it(tmp_path_factory, part):
    with pytest.raises(BadArguments, match="is not key=value"):
        check_model_arguments(f"path={tmp_path_factory.getbasetemp()},{part}")


def test_model_argument_refusals_name_the_key(tmp_path):
    with pytest.raises(BadArguments, match=r"'scorng' \(did you mean 'scoring'\?\)"):
        check_model_arguments(f"path={tmp_path},scorng=beam")
    with pytest.raises(BadArguments, match=r"scoring='bogus' is not a scoring rule; choose one of beam"):
        check_model_arguments(f"path={tmp_path},scoring=bogus")
    with pytest.raises(BadArguments, match=r"beam='0' must be a whole number >= 1"):
        check_model_arguments(f"path={tmp_path},beam=0")
    with pytest.raises(BadArguments, match=r"path=\S+nowhere does not exist"):
        check_model_arguments(f"path={tmp_path / 'nowhere'}")
    with pytest.raises(BadArguments, match=rf"'{tmp_path}' is not key=value; write e\.g\. path={tmp_path}"):
        check_model_arguments(str(tmp_path))
    with pytest.raises(BadArguments, match="give the model as path=DIR"):
        check_model_arguments("scoring=beam")
    assert "scoring" in model_argument_names() and "unknown" not in model_argument_names()


@pytest.mark.parametrize("limit, ok", [(None, True), (0.5, True), (3, True), (0, False), (-2, False), (2.5, False)])
def test_limit(limit, ok):
    if ok:
        check_limit(limit)
    else:
        with pytest.raises(BadArguments, match="--limit"):
            check_limit(limit)


def test_task_names_get_a_did_you_mean():
    check_task_names([t.name for t in PAPER_SUITE], known=set())  # the paper's tasks need no index
    check_task_names(["mmlu_anatomy"], known={"mmlu_anatomy"})
    with pytest.raises(BadArguments, match=r"no task, group or tag 'mmlu_anatomi' \(did you mean 'mmlu_anatomy'\?\)"):
        check_task_names(["arc_easy", "mmlu_anatomi"], known={"mmlu_anatomy"})


def _write(tmp_path, task, rows):
    path = tmp_path / f"{task}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


#: task -> a row of task_docs with its answer moved outside its choices
WRONG_ANSWERS = {
    "arc_easy": lambda r: {**r, "answerKey": "E"}, "arc_challenge": lambda r: {**r, "answerKey": "a"},
    "piqa": lambda r: {**r, "label": 2}, "boolq": lambda r: {**r, "label": "maybe"},
    "winogrande": lambda r: {**r, "answer": "3"}, "social_iqa": lambda r: {**r, "label": "0"},
    "hellaswag": lambda r: {**r, "label": str(len(r["endings"]))}, "logiqa": lambda r: {**r, "label": "e"},
}


@pytest.mark.parametrize("task", sorted(WRONG_ANSWERS))
def test_an_answer_outside_the_choices_is_refused_naming_the_row(tmp_path, task):
    good = task_docs(task, n=3)
    assert check_task_file(task, _write(tmp_path, task, good)) == 3
    with pytest.raises(BadTaskData, match=rf"{task}\.jsonl:2: {task} row's {ANSWERS[task][0]}: .*the answer must "
                                          "name one of the row's choices"):
        check_task_file(task, _write(tmp_path, task, [good[0], WRONG_ANSWERS[task](good[1])]))


def test_mmlu_answers_and_paired_texts_and_labels(tmp_path):
    row = {"question": "2+2?", "choices": ["3", "4", "5", "6"], "answer": 1}
    assert check_task_file("mmlu_math", _write(tmp_path, "mmlu_math", [row])) == 1
    with pytest.raises(BadTaskData, match=r"mmlu_math row's answer: 4 names none of its 4 choices"):
        check_task_file("mmlu_math", _write(tmp_path, "mmlu_math", [{**row, "answer": 4}]))
    truthful = task_docs("truthfulqa_mc1", n=1)[0]
    truthful["mc1_targets"]["labels"] = truthful["mc1_targets"]["labels"][:-1]
    with pytest.raises(BadTaskData, match=r"has 4 choice text\(s\) in mc1_targets\.choices but 3 label\(s\)"):
        check_task_file("truthfulqa_mc1", _write(tmp_path, "truthfulqa_mc1", [truthful]))
