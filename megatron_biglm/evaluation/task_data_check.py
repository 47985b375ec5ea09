"""Check local zero-shot task data (`--data-dir`) row by row before lm-eval reads it.

Why: lm-eval's templates index each row's fields; a row without `question`, or with an empty
choice list, fails deep inside a Jinja template (or scores a question with nothing to choose
from) long after the model was loaded. Each suite task's HF schema is listed here: the fields
every row needs, and the field holding its choices (which must not be empty). Where a task's
answer names one of its choices, the answer must be among them (an `answerKey` outside the
labels, or a label index past the endings, fails inside lm-eval's template), and where choice
texts come with their own labels, there are as many of each (one text and two labels would be
scored as if the missing choice did not exist).
"""
from __future__ import annotations

from megatron_biglm.data.rows import BadInputError, json_lines

#: task -> (required fields, choices field or None); dotted names reach into a nested object.
SCHEMAS = {
    "arc_easy": (("question", "choices.text", "answerKey"), "choices.text"),
    "arc_challenge": (("question", "choices.text", "answerKey"), "choices.text"),
    "piqa": (("goal", "sol1", "sol2", "label"), None),
    "sciq": (("question", "distractor1", "distractor2", "distractor3", "correct_answer"), None),
    "winogrande": (("sentence", "option1", "option2", "answer"), None),
    "logiqa": (("context", "question", "options", "label"), "options"),
    "race": (("article", "problems"), None),
    "social_iqa": (("context", "question", "answerA", "answerB", "answerC", "label"), None),
    "boolq": (("question", "passage", "label"), None),
    "hellaswag": (("ctx", "activity_label", "endings", "label"), "endings"),
    "truthfulqa_mc1": (("question", "mc1_targets.choices", "mc1_targets.labels"), "mc1_targets.choices"),
    "mmlu": (("question", "choices", "answer"), "choices"),  # every mmlu_<subject> (cais/mmlu)
}


def _index_in(choices: str, base: int = 0):
    """The answer is a whole number (or its text) naming one of `choices`, counted from `base`."""
    def check(row, answer):
        options = _get(row, choices) or []
        try:
            value = int(str(answer).strip()) - base
        except ValueError:
            value = None
        if value is None or isinstance(answer, float) or not 0 <= value < len(options):
            return f"{answer!r} names none of its {len(options)} choices ({choices}; counted from {base})"
        return None
    return check


def _fixed(*values):
    def check(row, answer):  # noqa: ARG001
        return None if str(answer).strip().lower() in values else f"{answer!r} is not one of {list(values)}"
    return check


def _arc_answer(row, answer):
    labels = _get(row, "choices.label") or []
    return None if answer in labels else f"answerKey {answer!r} is not among its labels {labels}"


#: task -> (answer field, rule): None when the answer names one of the row's choices, else why not
ANSWERS = {
    "arc_easy": ("answerKey", _arc_answer), "arc_challenge": ("answerKey", _arc_answer),
    "piqa": ("label", _fixed("0", "1")), "boolq": ("label", _fixed("0", "1", "true", "false")),
    "winogrande": ("answer", _fixed("1", "2")), "social_iqa": ("label", _fixed("1", "2", "3")),
    "hellaswag": ("label", _index_in("endings")), "mmlu": ("answer", _index_in("choices")),
    "logiqa": ("label", lambda row, answer: None if str(answer).strip() in "abcd"[:len(_get(row, "options") or [])]
               and str(answer).strip() else f"{answer!r} is not one of the option letters "
               f"{list('abcd'[:len(_get(row, 'options') or [])])}"),
}

#: task -> (choice texts, their labels): as many of each
PAIRED = {"arc_easy": ("choices.text", "choices.label"), "arc_challenge": ("choices.text", "choices.label"),
          "truthfulqa_mc1": ("mc1_targets.choices", "mc1_targets.labels")}


class BadTaskData(BadInputError):
    """A local task file has a row lm-eval cannot score; the message names file:line and the fix."""


def _get(row: dict, dotted: str):
    value = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _count(value) -> int:
    return len(value) if isinstance(value, list) else 0


def check_task_file(task: str, path) -> int:
    """Rows in `path` after checking each against `task`'s schema (tasks not listed: only JSON)."""
    schema_task = "mmlu" if task.startswith("mmlu_") else task
    fields, choices = SCHEMAS.get(schema_task, ((), None))
    hint = (f"write every row of {task} in its HF schema (fields: {', '.join(fields)})" if fields
            else "write one JSON object per line")
    rows = 0
    for number, row in json_lines(path, BadTaskData, hint):
        where = f"{path}:{number}"
        if not isinstance(row, dict):
            raise BadTaskData(f"{where}: not a JSON object; {hint}")
        missing = [f for f in fields if _get(row, f) in (None, "")]
        if missing:
            raise BadTaskData(f"{where}: {task} row lacks {', '.join(missing)}; {hint}")
        if choices is not None and not _get(row, choices):
            raise BadTaskData(f"{where}: {task} row has no choices ({choices} is empty); give each "
                              f"question at least two choices, or remove the row")
        if schema_task in PAIRED:
            texts, labels = (_get(row, f) for f in PAIRED[schema_task])
            if not isinstance(texts, list) or not isinstance(labels, list) or len(texts) != len(labels):
                raise BadTaskData(f"{where}: {task} row has {_count(texts)} choice text(s) in {PAIRED[schema_task][0]} "
                                  f"but {_count(labels)} label(s) in {PAIRED[schema_task][1]}; give every choice "
                                  "one text and one label")
        if schema_task in ANSWERS:
            field, rule = ANSWERS[schema_task]
            wrong = rule(row, _get(row, field))
            if wrong:
                raise BadTaskData(f"{where}: {task} row's {field}: {wrong}; the answer must name one of the "
                                  "row's choices")
        rows += 1
    if rows == 0:
        raise BadTaskData(f"{path} holds no rows; {hint}")
    return rows
