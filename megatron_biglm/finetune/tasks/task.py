"""`Task`: what a fine-tuning recipe needs to know about one task, as plain data.

A task names its data set (a `data_files.SCHEMAS` entry), the fields it reads, how it is
modelled (`kind`), and how it is scored (`metrics`, with `select` the number that picks the
best checkpoint). The kinds:
  * `verbalizer`: prompted classification; the label word is predicted at `<mask>` slots by
    the masked-LM head (see `verbalizer.py`);
  * `head`: a classification head on pooled encoder states (`head_classification.py`);
  * `span`: extractive QA with a start/end head over context windows (`squad_windows.py`);
  * `seq2seq`: source as prefix, target as suffix, decoded with Mask-Predict (`seq2seq.py`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KINDS = ("verbalizer", "head", "span", "seq2seq")
METRIC_NAMES = ("accuracy", "macro_f1", "squad", "rouge", "bleu", "meteor")


@dataclass(frozen=True)
class Task:
    name: str
    dataset: str
    kind: str
    fields: tuple[str, ...]
    metrics: tuple[str, ...]
    select: str
    label_field: str | None = "label"
    train_split: str = "train"
    eval_splits: tuple[str, ...] = ("validation",)
    prompt: Any = None  # a VerbalizerPrompt for kind "verbalizer"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"task {self.name}: kind {self.kind!r} is not one of {KINDS}")
        unknown = [m for m in self.metrics if m not in METRIC_NAMES]
        if unknown or not self.metrics:
            raise ValueError(f"task {self.name}: metrics {list(self.metrics)} must be some of {METRIC_NAMES}")
        if (self.kind == "verbalizer") != (self.prompt is not None):
            raise ValueError(f"task {self.name}: a prompt is required for, and only for, kind 'verbalizer'")
