"""Check local zero-shot task data (`--data-dir`) row by row before lm-eval reads it.

Why: lm-eval's templates index each row's fields; a row without `question`, or with an empty
choice list, fails deep inside a Jinja template (or scores a question with nothing to choose
from) long after the model was loaded. Each suite task's HF schema is listed here: the fields
every row needs, and the field holding its choices (which must not be empty).
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


class BadTaskData(BadInputError):
    """A local task file has a row lm-eval cannot score; the message names file:line and the fix."""


def _get(row: dict, dotted: str):
    value = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def check_task_file(task: str, path) -> int:
    """Rows in `path` after checking each against `task`'s schema (tasks not listed: only JSON)."""
    fields, choices = SCHEMAS.get(task, ((), None))
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
        rows += 1
    if rows == 0:
        raise BadTaskData(f"{path} holds no rows; {hint}")
    return rows
