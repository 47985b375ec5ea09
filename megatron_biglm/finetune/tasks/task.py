"""`Task`: what a fine-tuning recipe needs to know about one task, as plain data.

A task names its data set (a `data_files.SCHEMAS` entry, or the `DatasetSchema` of the columns a
declaration names: `declaration.py`), the fields it reads, how it is modelled (`kind`, and for a
head its `problem_type`), and how it is scored (`metrics`, with `select` the number that picks
the best checkpoint). `kind` names a registered kind (`finetune/kinds/`, one module each:
verbalizer, head, span, seq2seq, contrastive, instruct) or a `module:Class` of one's own; the
kind checks every task of it (`check_task`: e.g. a verbalizer needs its `prompt`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..kinds import kind_class

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
    prompt: Any = None  # the kind's prompt (a verbalizer's `VerbalizerPrompt`)
    problem_type: str = "single_label_classification"
    columns: dict = field(default_factory=dict, hash=False, compare=False)  # span: role -> column

    def __post_init__(self):
        try:
            kind = kind_class(self.kind)
        except ValueError as exc:
            raise ValueError(f"task {self.name}: {exc}") from None
        if not self.metrics:
            raise ValueError(f"task {self.name}: no metrics")
        for metric in self.metrics:
            check_metric_name(metric, f"task {self.name}")
        if self.problem_type not in kind.problem_types:
            raise ValueError(f"task {self.name}: problem_type {self.problem_type!r} is not one of "
                             f"{list(kind.problem_types)} (kind {self.kind!r})")
        kind.check_task(self)
