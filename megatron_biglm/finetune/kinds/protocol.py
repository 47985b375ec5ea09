"""`TaskKind`: the few methods a kind must write. Everything else on `FinetuneRecipe`
(`base.py`) is an optional hook with a documented default: `Options`, the declaration hooks
(`declaration_keys`, `problem_types`, `default_metrics`, `declared_schema`, `declare`,
`check_task`), `prepare` and `build_data` (read, encode and sample every split), `logits` and
`forward` (the full-attention forward, then `_loss`), `loss_tokens`, `settle`, `task_head`,
`state_dict`. `LabelRecipe` writes `evaluate_split` for a kind that predicts labels.

A kind with a data format of its own (`reads_columns = False`: contrastive, instruct) replaces
the reading hooks (`prepare`, `build_data`, `forward`) instead of `encode` and `collate`.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch

from ..row_report import RowReport

#: what `kind_class` checks a kind that reads a task's columns defines
REQUIRED = ("encode", "collate", "_loss", "evaluate_split")


@runtime_checkable
class TaskKind(Protocol):
    def encode(self, rows: list[dict], report: RowReport, training: bool) -> list:
        """The examples of `rows` (a row may give none, counted in `report`, or several)."""

    def collate(self, examples: Sequence) -> dict:
        """One batch of tensors from examples."""

    def _loss(self, batch: dict, logits: torch.Tensor):
        """`(loss_sum, count, report)` of a batch from the model's logits."""

    def evaluate_split(self, model, name: str, examples: list, device) -> dict[str, float]:
        """The task's scores of one evaluation split."""


def unwritten(cls, base) -> list[str]:
    """The `REQUIRED` methods `cls` leaves as `base` has them (unwritten); none for a kind with
    a data format of its own."""
    if not cls.reads_columns:
        return []
    return [name for name in REQUIRED if getattr(cls, name) is getattr(base, name)]
