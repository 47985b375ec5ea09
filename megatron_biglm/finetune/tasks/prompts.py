"""The fine-tuning tasks and those of the encoder instruction-tuning spec, with their prompts.

Seed 001 fixes the verbalizer, not the prompt text: label words "yes"/"no", plus "maybe" for
CB (its §3.2/§4.4); one fixed prompt per task across all paradigms. The templates below are
ours, written in that spirit (yes/no questions ending in "Answer: <mask>"); MNLI uses the
RTE-style template with True/False/Neither. Label word i verbalises the data set's label index i
(`data_files.SCHEMAS[...].label_names`), e.g. CB: entailment -> yes, contradiction -> no,
neutral -> maybe. COPA's binary label (choice2 is the answer) is asked as a yes/no question.

Every classification task also has a `<name>_head` variant (kind "head", same data and
metric) for the seed's head-fine-tuning baseline.
"""
from __future__ import annotations

from .task import Task
from .verbalizer import VerbalizerPrompt

PROMPTS: dict[str, VerbalizerPrompt] = {
    "mnli": VerbalizerPrompt(
        "{premise} Question: {hypothesis} True, False or Neither? Answer: <mask>",
        ("True", "Neither", "False")),          # entailment, neutral, contradiction
    "boolq": VerbalizerPrompt(
        "{passage} Question: {question}? Yes or no? Answer: <mask>",
        ("no", "yes")),                          # False, True
    "cb": VerbalizerPrompt(
        "{premise} Question: {hypothesis} Yes, no, or maybe? Answer: <mask>",
        ("yes", "no", "maybe")),                 # entailment, contradiction, neutral
    "copa": VerbalizerPrompt(
        "{premise} What was the {question}? Option 1: {choice1} Option 2: {choice2} "
        "Is option 2 more plausible than option 1? Answer: <mask>",
        ("no", "yes"),                           # label 0: choice1, 1: choice2
        truncatable=("premise", "choice1", "choice2")),
    "rte": VerbalizerPrompt(
        "{premise} Question: {hypothesis} Yes or no? Answer: <mask>",
        ("yes", "no")),                          # entailment, not_entailment
    "wic": VerbalizerPrompt(
        "{sentence1} {sentence2} Question: Is the word \"{word}\" used with the same meaning "
        "in both sentences? Yes or no? Answer: <mask>",
        ("no", "yes"),                           # False, True
        truncatable=("sentence1", "sentence2")),
}

_DATASETS = {"mnli": "glue/mnli", "boolq": "super_glue/boolq", "cb": "super_glue/cb",
             "copa": "super_glue/copa", "rte": "super_glue/rte", "wic": "super_glue/wic"}
_METRIC = {"cb": "macro_f1"}
_EVAL_SPLITS = {"mnli": ("validation_matched", "validation_mismatched")}


def _classification_tasks() -> list[Task]:
    tasks = []
    for name, dataset in _DATASETS.items():
        metric = _METRIC.get(name, "accuracy")
        metrics = (metric, "accuracy") if metric != "accuracy" else (metric,)
        prompt = PROMPTS[name]
        common = dict(dataset=dataset, fields=prompt.fields, metrics=metrics, select=metric,
                      eval_splits=_EVAL_SPLITS.get(name, ("validation",)))
        tasks.append(Task(name=name, kind="verbalizer", prompt=prompt, **common))
        tasks.append(Task(name=f"{name}_head", kind="head", **common))
    return tasks


TASKS: dict[str, Task] = {t.name: t for t in _classification_tasks() + [
    Task(name="squad", dataset="squad", kind="span", fields=("question", "context"),
         metrics=("squad",), select="f1", label_field=None),
    Task(name="xsum", dataset="xsum", kind="seq2seq", fields=("document", "summary"),
         metrics=("rouge",), select="rougeL", label_field=None),
    Task(name="msqg", dataset="msqg", kind="seq2seq", fields=("source", "target"),
         metrics=("rouge", "bleu", "meteor"), select="rougeL", label_field=None),
]}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(sorted(TASKS))}")
    return TASKS[name]
