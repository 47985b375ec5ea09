"""Fine-tuning rows from local jsonl, csv, tsv or parquet files (by extension, plain or
.gz/.zst; a UTF-8 byte-order mark is accepted) in a data set's schema, or from the hub through
`datasets.load_dataset` for users who have one.

A schema is a built-in data set's HF layout (`SCHEMAS`) or the columns a user's task declares
(`tasks/declaration.py`). Both paths go through the same per-row check, so a local file and the
hub give the same rows: required text fields present and non-empty, the label one of the
schema's labels (single-label: an index or a name; regression: a number; multi-label: a list of
names, or in csv/tsv one string of names joined by the schema's `label_separator`), SQuAD
`answers` well formed, a seq2seq target non-empty. A row failing a check is dropped and counted
by reason, with its file and line, in a `RowReport` (never silently); `strict=True` raises
`BadInputError` at the first one instead. Files are found by `data.readers.expand_inputs`
(globs, directories) and read by the one row reader, `data/rows.py` (formats, compression,
undecodable bytes); a file that cannot be read to its end stops the run unless
`finetune.skip_unreadable` is set.

    rows, report = load_split("super_glue/cb", files=["cb/val.jsonl"])
    print(report.summary_line())   # rows 56: kept 56, dropped 0; truncated: none
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping

from megatron_biglm.common.config_fields import ConfigError, unknown_key_error
from megatron_biglm.common.hub import hub_access
from megatron_biglm.data.readers import NOT_AN_OBJECT, expand_inputs
from megatron_biglm.data.rows import SKIP, STOP, Row, format_by_suffix, iter_rows

from .labels import _INTEGER, label_order, label_text, names_a_number  # noqa: F401  (the one label rule)
from .row_report import BAD_ANSWERS, BAD_LABEL, EMPTY_FIELD, EMPTY_TARGET, MISSING_FIELD, UNLABELED, RowReport


@dataclass(frozen=True)
class DatasetSchema:
    """The fields of one data set as the HF hub serves it.

    `text_fields` must be non-empty strings; `target_field` (seq2seq) too, but counted as
    `empty_target`; `label_names[i]` names label index i; `label_kind`: "single" (one index),
    "regression" (a float; no names) or "multi" (a tuple of indices, any number of them);
    `answers_field` is SQuAD's {"text": [...], "answer_start": [...]}; `extra_fields` are copied
    when present (ids, WiC's character spans).

    A label value is the name it spells (`label_text`: 2, 2.0 and "2" all spell "2"); only
    where `label_indices` holds (the hub's ClassLabel columns; declared names none of which is
    a number) does an integer that names no label mean the label at that index. `unlabeled` is
    the value a schema declares for "no label" (the hub's -1 on test rows); None: it has none."""
    name: str
    hub_path: str
    hub_config: str | None
    text_fields: tuple[str, ...]
    label_names: tuple[str, ...] = ()
    label_field: str | None = "label"
    target_field: str | None = None
    answers_field: str | None = None
    extra_fields: tuple[str, ...] = ("idx",)
    label_kind: str = "single"
    label_separator: str = ","
    label_indices: bool = True
    unlabeled: object = -1

    @property
    def required(self) -> tuple[str, ...]:
        extra = (self.target_field, self.answers_field)
        return self.text_fields + tuple(f for f in extra if f)


def _classification(name, config, fields, labels, extra=("idx",)):
    return DatasetSchema(name, name.split("/")[0], config, fields, labels, extra_fields=extra)


SCHEMAS: dict[str, DatasetSchema] = {s.name: s for s in (
    _classification("glue/mnli", "mnli", ("premise", "hypothesis"),
                    ("entailment", "neutral", "contradiction")),
    _classification("super_glue/boolq", "boolq", ("passage", "question"), ("False", "True")),
    _classification("super_glue/cb", "cb", ("premise", "hypothesis"),
                    ("entailment", "contradiction", "neutral")),
    _classification("super_glue/copa", "copa", ("premise", "choice1", "choice2", "question"),
                    ("choice1", "choice2")),
    _classification("super_glue/rte", "rte", ("premise", "hypothesis"),
                    ("entailment", "not_entailment")),
    _classification("super_glue/wic", "wic", ("word", "sentence1", "sentence2"), ("False", "True"),
                    extra=("idx", "start1", "end1", "start2", "end2")),
    DatasetSchema("squad", "squad", None, ("context", "question"), label_field=None,
                  answers_field="answers", extra_fields=("id", "title")),
    DatasetSchema("xsum", "xsum", None, ("document",), label_field=None,
                  target_field="summary", extra_fields=("id",)),
    DatasetSchema("msqg", "msqg", None, ("source",), label_field=None, target_field="target",
                  extra_fields=("id",)),
)}


def get_schema(schema: str | DatasetSchema) -> DatasetSchema:
    if isinstance(schema, DatasetSchema):
        return schema
    if schema not in SCHEMAS:
        raise ValueError(f"unknown data set {schema!r}; known: {', '.join(sorted(SCHEMAS))}")
    return SCHEMAS[schema]


def check_row(raw, schema: DatasetSchema, report: RowReport, source, line: int, *,
              require_labels: bool = True) -> dict | None:
    """The row in schema form (label as an int index, None if unlabeled and allowed), or
    None after counting why it was dropped."""
    report.rows_seen += 1
    if not isinstance(raw, Mapping):
        report.skip(NOT_AN_OBJECT, source, line, f"row is a {type(raw).__name__}")
        return None
    row: dict = {}
    for field in schema.required:
        if field not in raw or raw[field] is None:
            report.skip(MISSING_FIELD, source, line, f"no field {field!r} (fields: {sorted(raw)[:8]})")
            return None
        value = raw[field]
        if field == schema.answers_field:
            answers = _check_answers(value)
            if answers is None:
                report.skip(BAD_ANSWERS, source, line, f"{field!r} is not {{text: [..], answer_start: [..]}} "
                            "with equal, non-empty lists")
                return None
            row[field] = answers
            continue
        if not isinstance(value, str) or not value.strip():
            reason = EMPTY_TARGET if field == schema.target_field else EMPTY_FIELD
            report.skip(reason, source, line, f"field {field!r} is {'empty' if isinstance(value, str) else type(value).__name__}")
            return None
        row[field] = value
    if schema.label_field:
        value = raw.get(schema.label_field)
        label = _label(value, schema)
        if label is _BAD:
            report.skip(BAD_LABEL, source, line, f"{schema.label_field}={value!r} {_label_rule(schema)}")
            return None
        if label is None and require_labels:
            marker = "" if schema.unlabeled is None else f"{schema.unlabeled} or "
            why = (f"no field {schema.label_field!r} (fields: {sorted(raw)[:8]})" if schema.label_field not in raw
                   else f"label {marker}empty (a test split?); pass require_labels=False to keep unlabeled rows")
            report.skip(UNLABELED, source, line, why)
            return None
        row[schema.label_field] = label
    for field in schema.extra_fields:
        if field in raw:
            row[field] = raw[field]
    report.rows_kept += 1
    return row


_BAD = object()


def _label(value, schema: DatasetSchema):
    """The row's label in the schema's form, None when missing/unlabeled, or _BAD. A blank
    multi-label cell is a row with no label (the empty set), not a missing one."""
    if value is None or (isinstance(value, str) and not value.strip() and schema.label_kind != "multi"):
        return None
    if schema.label_kind == "regression":
        if isinstance(value, bool):
            return _BAD
        try:
            number = float(value)
        except (TypeError, ValueError):
            return _BAD
        return number if math.isfinite(number) else _BAD
    if schema.label_kind == "multi":
        if isinstance(value, str):
            value = [v.strip() for v in value.split(schema.label_separator) if v.strip()]
        if not isinstance(value, (list, tuple)):
            value = [value]  # one label, as label inference reads it
        indices = [_label_index(v, schema) for v in value]
        if any(i is None or i is _BAD for i in indices):
            return _BAD
        return tuple(sorted(set(indices)))
    return _label_index(value, schema)


def _label_rule(schema: DatasetSchema) -> str:
    if schema.label_kind == "regression":
        return "is not a number (a regression label must be a finite number)"
    names = list(schema.label_names)
    if schema.label_kind == "multi":
        return (f"is not a list of labels of {names} (in csv/tsv: names joined by "
                f"{schema.label_separator!r})")
    return f"is not one of the labels {names}" + (f" (nor an index 0..{len(names) - 1})" if schema.label_indices else "")


def _label_index(value, schema: DatasetSchema):
    """The index of the label `value` names (see DatasetSchema), None for the schema's
    unlabeled marker, or _BAD."""
    names = schema.label_names
    text = label_text(value)
    if text is None:
        return _BAD
    if schema.unlabeled is not None and text == label_text(schema.unlabeled):
        return None
    if text in names:
        return names.index(text)
    if schema.label_indices and isinstance(value, bool):
        text = str(int(value))
    if schema.label_indices and _INTEGER.fullmatch(text):
        index = int(text)
        return index if 0 <= index < len(names) else _BAD
    return _BAD


@dataclass(frozen=True)
class LabelColumn:
    """A label column as the training files hold it: every value (rows without one left
    out), the columns each file's first row has (to name them when the column is absent), and
    whether any row has the column at all."""
    values: list
    columns: dict
    present: bool


def label_column(raw_rows: Iterable[Row], field: str) -> LabelColumn:
    """The `LabelColumn` of `field` in rows already read (`raw_split`)."""
    values, columns, present = [], {}, False
    for path, _, raw in raw_rows:
        if isinstance(raw, Mapping):
            columns.setdefault(str(path), sorted(map(str, raw)))
            present = present or field in raw
            if raw.get(field) is not None:
                values.append(raw[field])
    return LabelColumn(values, columns, present)


def _check_answers(value) -> dict | None:
    if not isinstance(value, Mapping):
        return None
    texts, starts = value.get("text"), value.get("answer_start")
    if not isinstance(texts, (list, tuple)) or not isinstance(starts, (list, tuple)):
        return None
    if not texts or len(texts) != len(starts):
        return None
    if not all(isinstance(t, str) and t.strip() for t in texts):
        return None
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in starts):
        return None
    return {"text": list(texts), "answer_start": list(starts)}


@dataclass(frozen=True)
class RawSplit:
    """A split's local files read once, unchecked: every `Row` the reader gave and the report
    of what it skipped (the row checks add to the same report)."""
    rows: tuple
    report: RowReport


def raw_split(inputs, *, strict: bool = False, skip_unreadable: bool = False) -> RawSplit:
    """The rows of local files as the reader gives them, before any schema check: read once,
    then checked (`check_rows`) and, for a task that lists no labels, its labels inferred."""
    report = RowReport(strict=strict)
    return RawSplit(tuple(file_objects(inputs, report, what="fine-tuning data", skip_unreadable=skip_unreadable)),
                    report)


def check_rows(raw: RawSplit, schema: str | DatasetSchema, *, require_labels: bool = True) -> tuple[list[dict], RowReport]:
    """The good rows of a split read by `raw_split`, in order, and the report of the rest."""
    schema = get_schema(schema)
    rows = [row for path, line, item in raw.rows
            if (row := check_row(item, schema, raw.report, path, line, require_labels=require_labels)) is not None]
    return rows, raw.report


def read_rows(inputs, schema: str | DatasetSchema, *, report: RowReport | None = None,
              require_labels: bool = True, strict: bool = False,
              skip_unreadable: bool = False) -> tuple[list[dict], RowReport]:
    """All good rows of local files (paths, globs, directories; jsonl, csv, tsv, parquet, plain
    or compressed), in order, and the report of the rest. A file that cannot be read to its
    end stops with BadInputError unless `skip_unreadable` (then its rest is one counted loss)."""
    schema = get_schema(schema)
    report = report if report is not None else RowReport(strict=strict)
    rows = []
    for path, line, raw in file_objects(inputs, report, what="fine-tuning data", skip_unreadable=skip_unreadable):
        row = check_row(raw, schema, report, path, line, require_labels=require_labels)
        if row is not None:
            rows.append(row)
    return rows, report


#: the formats a fine-tuning file may have, by extension (after .gz/.zst); a directory lists them all
DATA_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv",
                ".parquet": "parquet", ".pq": "parquet"}


def data_format(path) -> str:
    """jsonl, csv, tsv or parquet from the file name, or a ValueError naming the accepted ones."""
    return format_by_suffix(path, DATA_FORMATS, "{path}: fine-tuning data must be jsonl (one JSON object per "
                            "line), csv, tsv or parquet, told apart by the extension ({suffixes}, optionally "
                            "+ .gz/.zst); rename the file to its format's extension")


def file_objects(inputs, report: RowReport, *, what: str, skip_unreadable: bool = False) -> Iterator[Row]:
    """The rows of local files (paths, globs, directories; jsonl/csv/tsv/parquet, plain or
    compressed) in order, read by the one row reader (`data/rows.py`); `what` names the data in
    the error for another format. A file that cannot be read to its end stops with
    BadInputError naming it, unless `skip_unreadable` (`finetune.skip_unreadable`): then the
    rows before the damage are kept and the rest is counted as one loss."""
    for path in expand_inputs(inputs, report, DATA_FORMATS):
        try:
            fmt = data_format(path)
        except ValueError as exc:
            raise ValueError(f"{exc} ({what})") from None
        yield from iter_rows(path, fmt=fmt, skips=report, on_unreadable=SKIP if skip_unreadable else STOP,
                             opt_in="finetune.skip_unreadable=true")


def hub_rows(schema: str | DatasetSchema, split: str, *, report: RowReport | None = None,
             require_labels: bool = True, strict: bool = False, **load_kwargs) -> tuple[list[dict], RowReport]:
    """The same rows from `datasets.load_dataset(hub_path, hub_config, split=split)` (needs a
    hub, or a local `datasets` cache); checked exactly like local files."""
    import datasets  # lazy: start-up (datasets: 0.9 CPU s)

    schema = get_schema(schema)
    report = report if report is not None else RowReport(strict=strict)
    with hub_access(f"{schema.hub_path} ({split})",
                    f"finetune.data.{split}=FILE (jsonl/csv/tsv/parquet in the {schema.name} schema)"):
        data = datasets.load_dataset(schema.hub_path, schema.hub_config, split=split, **load_kwargs)
    rows = _checked(enumerate(data, start=1), schema, report, f"{schema.name}[{split}]", require_labels)
    return rows, report


def _checked(numbered: Iterable, schema, report, source, require_labels) -> list[dict]:
    rows = []
    for line, raw in numbered:
        row = check_row(raw, schema, report, source, line, require_labels=require_labels)
        if row is not None:
            rows.append(row)
    return rows


def check_split_files(data: Mapping, splits: Iterable[str], where: str = "finetune.data") -> None:
    """Before anything is read: every key of `data` is one of the run's `splits`, and each names
    files that exist in an accepted format (a literal path, a directory, or a glob matching at
    least one file). Raises ConfigError naming the key, the file and what to do."""
    splits = [s for s in dict.fromkeys(splits) if s]
    unknown = [k for k in data if k not in splits]
    if unknown:
        raise unknown_key_error(where, unknown, splits, headline="unknown split {first!r}: it would never be read")
    for split, files in data.items():
        if files is None:
            continue
        report = RowReport()
        found = expand_inputs(files, report, DATA_FORMATS)
        if report.counts:
            raise ConfigError(f"{where}.{split}: {'; '.join(report.example_lines())}; give an existing file, "
                              "directory or glob")
        for path in found:
            if not os.path.isfile(path):
                raise ConfigError(f"{where}.{split}: {path} does not exist (working directory {os.getcwd()})")
            try:
                data_format(path)
            except ValueError as exc:
                raise ConfigError(f"{where}.{split}: {exc}") from None


def load_split(schema: str | DatasetSchema, *, files=None, split: str | None = None, require_labels: bool = True,
               strict: bool = False, skip_unreadable: bool = False, **load_kwargs) -> tuple[list[dict], RowReport]:
    """Rows of one split: from `files` when given (no hub touched), else from the hub split."""
    if files:
        return read_rows(files, schema, require_labels=require_labels, strict=strict, skip_unreadable=skip_unreadable)
    if not split:
        raise ValueError("give local `files`, or a hub `split` name (e.g. 'validation')")
    return hub_rows(schema, split, require_labels=require_labels, strict=strict, **load_kwargs)
