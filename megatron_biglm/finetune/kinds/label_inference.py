"""A task's label names when its declaration lists none: the values of the training split's
label column by the one label rule (`finetune/labels.py`: 0 and 0.0 are one label, values of
one kind, in `label_order`). Rows are matched to them by value, never by position, and no value
is an "unlabeled" marker. Read off the rows the kind's plan
reads once (`planning.py`), so the training file is read one time."""
from __future__ import annotations

import dataclasses

from ..columns import TaskDeclarationError
from ..data_files import RawSplit, get_schema, label_column
from ..labels import LabelValueError, inferred_labels


def needs_labels(task) -> bool:
    """Whether `task` lists no label names and has a label column to infer them from."""
    schema = get_schema(task.dataset)
    return not (schema.label_field is None or schema.label_names or schema.label_kind == "regression")


def infer_labels(task, train: RawSplit | None):
    """(`task` with its label names filled in from the training rows `train` when it declared
    none, the note that says so or None when nothing was inferred)."""
    if not needs_labels(task):
        return task, None
    schema = get_schema(task.dataset)
    if train is None:
        raise TaskDeclarationError(f"task {task.name}: list its labels (finetune.task.labels): they are "
                                   "inferred from local training files, and this run has none")
    report = train.report
    column = label_column(train.rows, schema.label_field)
    if not column.values and report.no_rows:
        raise TaskDeclarationError(f"task {task.name}: the training split has no row to infer labels from: "
                                   + "; ".join(report.no_rows_lines()))
    if column.columns and not column.present:
        raise TaskDeclarationError(f"task {task.name}: {_no_column(schema.label_field, column.columns)}")
    try:
        names = inferred_labels(column.values, schema.label_field, multi=schema.label_kind == "multi",
                                separator=schema.label_separator)
    except LabelValueError as exc:
        raise TaskDeclarationError(f"task {task.name}: the training split: {exc}") from None
    if len(names) < (1 if schema.label_kind == "multi" else 2):
        if not column.values and report.total:
            raise TaskDeclarationError(
                f"task {task.name}: the training split has no row to infer labels from ({report.summary_line()}): "
                + "; ".join(report.example_lines()[:3]))
        raise TaskDeclarationError(
            f"task {task.name}: the training split's {schema.label_field!r} column holds {names or 'no values'}; "
            "a classification task needs at least two labels (check label_field, or list labels)")
    task = dataclasses.replace(task, dataset=dataclasses.replace(schema, label_names=names, label_indices=False,
                                                                 unlabeled=None))
    mapping = ", ".join(f"{i}: {n}" for i, n in enumerate(names))
    return task, f"labels inferred from the training split's {schema.label_field!r} column: {mapping}"


def _no_column(field: str, columns: dict) -> str:
    """What to say when no row of the training files has the label column `field`."""
    found = "; ".join(f"{path} has {names}" for path, names in columns.items())
    joined = [n for names in columns.values() for n in names if any(sep in n for sep in ";\t|,")]
    hint = (f" ({joined[0]!r} looks like several column names in one: a .csv file is comma-separated and "
            "a .tsv file tab-separated; save it with that separator)" if joined else "")
    return (f"the training split has no column {field!r}: {found}{hint}. Set finetune.task.label_field to the "
            "label column")
