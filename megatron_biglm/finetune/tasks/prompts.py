"""The fine-tuning tasks and those of the encoder instruction-tuning spec, with their prompts.

“Scaling Effects of Instruction Tuning” fixes the verbalizer, not the prompt text: label words "yes"/"no", plus "maybe" for
CB (its §3.2/§4.4); one fixed prompt per task across all paradigms. The templates below are
ours, written in that spirit (yes/no questions ending in "Answer: <mask>"); MNLI uses the
RTE-style template with True/False/Neither. Label word i verbalises the data set's label index i
(`data_files.SCHEMAS[...].label_names`), e.g. CB: entailment -> yes, contradiction -> no,
neutral -> maybe. COPA's binary label (choice2 is the answer) is asked as a yes/no question.

Every classification task also has a `<name>_head` variant (kind "head", same data and
metric) for the seed's head-fine-tuning baseline. Each task is a declaration of the form a
user's own `finetune.task` mapping takes (`declaration.py`), built by the same function.
"""
from __future__ import annotations

from .declaration import declare_task
from .task import Task

_PROMPTS = {  # name -> (template, label words in the data set's label order, truncatable)
    "mnli": ("{premise} Question: {hypothesis} True, False or Neither? Answer: <mask>",
             ["True", "Neither", "False"], None),          # entailment, neutral, contradiction
    "boolq": ("{passage} Question: {question}? Yes or no? Answer: <mask>",
              ["no", "yes"], None),                        # False, True
    "cb": ("{premise} Question: {hypothesis} Yes, no, or maybe? Answer: <mask>",
           ["yes", "no", "maybe"], None),                  # entailment, contradiction, neutral
    "copa": ("{premise} What was the {question}? Option 1: {choice1} Option 2: {choice2} "
             "Is option 2 more plausible than option 1? Answer: <mask>",
             ["no", "yes"], ["premise", "choice1", "choice2"]),  # label 0: choice1, 1: choice2
    "rte": ("{premise} Question: {hypothesis} Yes or no? Answer: <mask>",
            ["yes", "no"], None),                          # entailment, not_entailment
    "wic": ("{sentence1} {sentence2} Question: Is the word \"{word}\" used with the same meaning "
            "in both sentences? Yes or no? Answer: <mask>",
            ["no", "yes"], ["sentence1", "sentence2"]),    # False, True
}
_DATASETS = {"mnli": "glue/mnli", "boolq": "super_glue/boolq", "cb": "super_glue/cb",
             "copa": "super_glue/copa", "rte": "super_glue/rte", "wic": "super_glue/wic"}
_METRIC = {"cb": "macro_f1"}
_EVAL_SPLITS = {"mnli": ["validation_matched", "validation_mismatched"]}


def _classification_declarations() -> dict[str, dict]:
    out = {}
    for name, dataset in _DATASETS.items():
        metric = _METRIC.get(name, "accuracy")
        template, words, truncatable = _PROMPTS[name]
        common = dict(dataset=dataset, metrics=[metric, "accuracy"] if metric != "accuracy" else [metric],
                      select=metric, eval_splits=_EVAL_SPLITS.get(name, ["validation"]))
        out[name] = dict(name=name, kind="verbalizer", template=template, label_words=words,
                         **({"truncatable": truncatable} if truncatable else {}), **common)
        out[f"{name}_head"] = dict(name=f"{name}_head", kind="head", **common)
    return out


#: the built-in tasks, declared in the form a user's `finetune.task` mapping takes
DECLARATIONS: dict[str, dict] = {**_classification_declarations(),
    "squad": dict(name="squad", kind="span", dataset="squad", metrics=["squad"], select="f1"),
    "xsum": dict(name="xsum", kind="seq2seq", dataset="xsum", metrics=["rouge"], select="rougeL"),
    "msqg": dict(name="msqg", kind="seq2seq", dataset="msqg", metrics=["rouge", "bleu", "meteor"], select="rougeL"),
}
TASKS: dict[str, Task] = {name: declare_task(spec, f"built-in task {name}") for name, spec in DECLARATIONS.items()}
#: name -> its `kinds.verbalizer.VerbalizerPrompt`
PROMPTS: dict = {name: TASKS[name].prompt for name in _PROMPTS}


def get_task(name_or_declaration) -> Task:
    """A built-in task by name, or the task a mapping declares (`declaration.py`)."""
    if isinstance(name_or_declaration, dict):
        return declare_task(name_or_declaration)
    if name_or_declaration not in TASKS:
        raise ValueError(f"unknown task {name_or_declaration!r}; known: {', '.join(sorted(TASKS))}, or declare "
                         "your own: finetune.task: {kind: head, fields: [text], label_field: label}")
    return TASKS[name_or_declaration]
