"""`Task`: what a fine-tuning recipe needs to know about one task, as plain data.

A task names its data set (a `data_files.SCHEMAS` entry, or the `DatasetSchema` of the columns a
declaration names: `declaration.py`), the fields it reads, how it is modelled (`kind`, and for a
head its `problem_type`), and how it is scored (`metrics`, with `select` the number that picks
the best checkpoint). The kinds:
  * `verbalizer`: prompted classification; the label word is predicted at `<mask>` slots by
    the masked-LM head (see `verbalizer.py`);
  * `head`: a classification head on pooled encoder states (`head_classification.py`):
    single-label (softmax), regression (one number, MSE) or multi-label (sigmoid per label);
  * `span`: extractive QA with a start/end head over context windows (`squad_windows.py`);
  * `seq2seq`: source as prefix, target as suffix, decoded with Mask-Predict (`seq2seq.py`);
  * `contrastive`: query/passage pairs, InfoNCE, validated by retrieval on BEIR folders
    (`recipes/contrastive.py`);
  * `instruct`: instruction tuning on a built instruction dataset, validated by the masked
    loss of the held-out one (`recipes/instruct.py`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KINDS = ("verbalizer", "head", "span", "seq2seq", "contrastive", "instruct")
PROBLEM_TYPES = ("single_label_classification", "regression", "multi_label_classification")
METRIC_NAMES = ("accuracy", "macro_f1", "squad", "rouge", "bleu", "meteor", "pearson", "spearman", "mse",
                "micro_f1", "subset_accuracy", "retrieval", "loss")


def check_metric_name(name: str, where: str = "metrics") -> None:
    """A built-in metric, or a user function `module:function` (imported when scored)."""
    if name in METRIC_NAMES or (name.count(":") == 1 and all(part.strip() for part in name.split(":"))):
        return
    raise ValueError(f"{where}: unknown metric {name!r}; use one of {list(METRIC_NAMES)} or a function "
                     "'module:function' taking (predictions, references) and returning a number or a dict")


@dataclass(frozen=True)
class Task:
    name: str
    dataset: Any   # a data_files.SCHEMAS name or a DatasetSchema
    kind: str
    fields: tuple[str, ...]
    metrics: tuple[str, ...]
    select: str
    label_field: str | None = "label"
    train_split: str = "train"
    eval_splits: tuple[str, ...] = ("validation",)
    prompt: Any = None  # a VerbalizerPrompt for kind "verbalizer"
    problem_type: str = "single_label_classification"
    columns: dict = field(default_factory=dict, hash=False, compare=False)  # span: role -> column

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"task {self.name}: kind {self.kind!r} is not one of {KINDS}")
        if not self.metrics:
            raise ValueError(f"task {self.name}: no metrics")
        for metric in self.metrics:
            check_metric_name(metric, f"task {self.name}")
        if self.problem_type not in PROBLEM_TYPES:
            raise ValueError(f"task {self.name}: problem_type {self.problem_type!r} is not one of {PROBLEM_TYPES}")
        if (self.kind == "verbalizer") != (self.prompt is not None):
            raise ValueError(f"task {self.name}: a prompt is required for, and only for, kind 'verbalizer'")
