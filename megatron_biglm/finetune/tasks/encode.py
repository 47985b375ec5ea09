"""Rows of a task's data set -> model examples, whatever the task's kind: the one call a
fine-tuning recipe makes to build its datasets.

    rows, report = data_files.load_split(task.dataset, files=[...])
    examples = encode_rows(task, rows, tokenizer, max_length=256, report=report)

Drops and truncations land in the same `RowReport` as the data-file checks, so one summary
line accounts for every row. A row is located as `<task>:<row number>` in the report.
Per-kind options (`**options`): verbalizer: `fill_short_labels_with`; span: `doc_stride`,
`max_query_length`, `training`; seq2seq: `max_target_length` (required), `append_eos`,
`overlong_source` (`max_length` is then the source budget).
"""
from __future__ import annotations

from typing import Sequence

from ..data_files import get_schema
from ..row_report import RowReport
from .head_classification import HeadEncoder
from .seq2seq import Seq2SeqEncoder
from .squad_windows import SquadEncoder
from .task import Task
from .verbalizer import VerbalizerEncoder


def make_encoder(task: Task, tokenizer, max_length: int, **options):
    """The encoder for `task.kind` (see the module doc for the options)."""
    if task.kind == "verbalizer":
        return VerbalizerEncoder(tokenizer, task.prompt, max_length, **options)
    if task.kind == "head":
        return HeadEncoder(tokenizer, get_schema(task.dataset).text_fields, max_length)
    if task.kind == "span":
        options.pop("training", None)
        return SquadEncoder(tokenizer, max_length=max_length, **options)
    if task.kind == "seq2seq":
        if "max_target_length" not in options:
            raise ValueError(f"task {task.name}: seq2seq needs max_target_length")
        return Seq2SeqEncoder(tokenizer, max_source_length=max_length, **options)
    raise ValueError(f"unknown task kind {task.kind!r}")


def encode_rows(task: Task, rows: Sequence[dict], tokenizer, *, max_length: int,
                report: RowReport | None = None, **options) -> list:
    """Examples of all rows (a SQuAD row gives one example per window)."""
    training = options.get("training", True)
    encoder = make_encoder(task, tokenizer, max_length, **options)
    schema = get_schema(task.dataset)
    out: list = []
    for number, row in enumerate(rows, start=1):
        where = dict(report=report, line=number)
        if task.kind in ("verbalizer", "head"):
            example = encoder.encode(row, row.get(task.label_field), source=task.name, **where)
            if example is not None:
                out.append(example)
        elif task.kind == "span":
            if task.columns:  # a declared task's own column names -> SQuAD's
                row = {role: row[column] for role, column in task.columns.items() if column in row}
            out.extend(encoder.encode(row, training=training, source=task.name, **where))
        else:
            example = encoder.encode(row[schema.text_fields[0]], row[schema.target_field],
                                     source_name=task.name, **where)
            if example is not None:
                out.append(example)
    return out
