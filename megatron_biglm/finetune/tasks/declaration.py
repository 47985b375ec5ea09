"""A task declared as data: `finetune.task` may be a mapping instead of a built-in name.

    finetune:
      task:
        kind: head                   # verbalizer | head | span | seq2seq | contrastive | instruct
        fields: [review]             # the text columns, in order
        label_field: sentiment
        labels: [neg, pos]           # optional: inferred from the training split (sorted)
      data: {train: train.csv, validation: valid.csv}

Every key (`DECLARATION_KEYS`; an unknown one is an error naming the valid ones):
  name                 what results and logs call the task (default "custom")
  kind                 how it is modelled (`task.KINDS`): verbalizer, head, span, seq2seq, contrastive
                       (pairs under data.train, a BEIR folder per evaluation split) or instruct
                       (instruction datasets built by `cli.instruct_data`)
  dataset              a built-in data set's columns (`data_files.SCHEMAS`, e.g. super_glue/cb),
                       instead of declaring them
  fields               the text columns in order (a verbalizer takes them from its template)
  label_field          the label column (default "label")
  labels               the label names, in index order; left out, they are the distinct values
                       of the training split's label column as written (1, "1" and 1.0 are one
                       label), numbers in numeric order, then other names sorted (printed, and
                       saved in the run's config.yaml as finetune.label_names). A value is
                       matched by its name; an integer that names no label is an index only
                       when the listed labels are not numbers. No value means "unlabeled"
                       here: a built-in data set (`dataset`) keeps its -1 test rows
  problem_type         head only: single_label_classification (default), regression (a number
                       per row; MSE; Pearson/Spearman) or multi_label_classification (any number
                       of labels per row; sigmoid; F1); HF's names, exported as config.json's
                       `problem_type`
  label_separator      multi-label in csv/tsv: the labels of a row joined by it (default ",")
  template             verbalizer: `{field}` placeholders and one `<mask>` for the label word
  label_words          verbalizer: one word per label (a list in label order, or {label: word})
  truncatable          verbalizer: the fields that may be cut to fit (default: all of them)
  source_field, target_field                 seq2seq (defaults: source, target)
  context_field, question_field, answers_field, id_field    span (SQuAD's names by default)
  metrics, select      the scores and the one that picks the best checkpoint (defaults per kind:
                       accuracy; pearson; micro_f1; squad f1; rougeL). A metric may be a user
                       function `module:function` (`metrics/task_scores.py`)
  train_split, eval_splits   the split names under finetune.data (train; [validation])
  hub, hub_config      the HF hub data set, read when `finetune.hub: true` and a split has no file

The built-in tasks (`prompts.py`) are declarations of this same form.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from megatron_biglm.common.config_fields import ConfigError

from ..data_files import DatasetSchema, get_schema, label_order, label_text, label_values, names_a_number
from .task import KINDS, PROBLEM_TYPES, Task, check_metric_name
from .verbalizer import VerbalizerPrompt

DECLARATION_KEYS = ("name", "kind", "dataset", "fields", "label_field", "labels", "problem_type",
                    "label_separator", "template", "label_words", "truncatable", "source_field", "target_field",
                    "context_field", "question_field", "answers_field", "id_field", "metrics", "select",
                    "train_split", "eval_splits", "hub", "hub_config")

_LABEL_KIND = {"single_label_classification": "single", "regression": "regression",
               "multi_label_classification": "multi"}
_DEFAULT_METRICS = {  # (kind, problem_type) -> (metrics, select)
    ("verbalizer", "single_label_classification"): (("accuracy",), "accuracy"),
    ("head", "single_label_classification"): (("accuracy",), "accuracy"),
    ("head", "regression"): (("pearson", "spearman", "mse"), "pearson"),
    ("head", "multi_label_classification"): (("micro_f1", "macro_f1", "subset_accuracy"), "micro_f1"),
    ("span", "single_label_classification"): (("squad",), "f1"),
    ("seq2seq", "single_label_classification"): (("rouge",), "rougeL"),
    ("contrastive", "single_label_classification"): (("retrieval",), "ndcg@10"),
    ("instruct", "single_label_classification"): (("loss",), "loss"),
}


class TaskDeclarationError(ConfigError):
    """A declared task is wrong; the message names the key and what it may be."""


def declare_task(spec: Mapping, where: str = "finetune.task") -> Task:
    """The `Task` a declaration describes (see the module doc). Labels left out stay None on
    the task until `with_labels` fills them from the training split."""
    if not isinstance(spec, Mapping):
        raise TaskDeclarationError(f"{where} must be a task name or a mapping, got {spec!r}")
    unknown = [k for k in spec if k not in DECLARATION_KEYS]
    if unknown:
        from megatron_biglm.common.config_fields import unknown_key_error

        raise unknown_key_error(where, unknown, list(DECLARATION_KEYS), error=TaskDeclarationError,
                                headline="unknown task key {first!r}")
    kind = spec.get("kind")
    if kind not in KINDS:
        raise TaskDeclarationError(f"{where}.kind must be one of {list(KINDS)}, got {kind!r}")
    problem = spec.get("problem_type", "single_label_classification")
    if problem not in PROBLEM_TYPES or (kind != "head" and problem != "single_label_classification"):
        allowed = list(PROBLEM_TYPES) if kind == "head" else ["single_label_classification"]
        raise TaskDeclarationError(f"{where}.problem_type must be one of {allowed} for kind {kind!r}, got {problem!r}")
    name = str(spec.get("name", "custom"))
    schema = _schema(spec, kind, problem, name, where)
    prompt, fields = None, schema.text_fields
    if kind == "verbalizer":
        prompt, schema = _prompt(spec, schema, where)
        fields = prompt.fields
    elif spec.get("truncatable") is not None:
        raise TaskDeclarationError(f"{where}: truncatable belongs to kind verbalizer, not {kind!r}")
    elif spec.get("template") is not None or spec.get("label_words") is not None:
        raise TaskDeclarationError(f"{where}: template and label_words belong to kind verbalizer, not {kind!r}")
    default_metrics, default_select = _DEFAULT_METRICS[(kind, problem)]
    metrics = tuple(str(m) for m in _list(spec.get("metrics", default_metrics), f"{where}.metrics"))
    for metric in metrics:
        check_metric_name(metric, f"{where}.metrics")
    select = str(spec.get("select", default_select if default_select in _score_keys(metrics) else
                          _score_keys(metrics)[0]))
    if select not in _score_keys(metrics):
        raise TaskDeclarationError(f"{where}.select={select!r} is not a score of the metrics {list(metrics)}; "
                                   f"pick one of {_score_keys(metrics)}")
    eval_splits = tuple(str(s) for s in _list(spec.get("eval_splits", ["validation"]), f"{where}.eval_splits"))
    dataset = str(spec["dataset"]) if spec.get("dataset") is not None and spec.get("labels") is None else schema
    return Task(name=name, dataset=dataset, kind=kind, fields=tuple(fields), metrics=metrics, select=select,
                label_field=schema.label_field, train_split=str(spec.get("train_split", "train")),
                eval_splits=eval_splits, prompt=prompt, problem_type=problem,
                columns=_columns(spec, kind))


def with_labels(task: Task, train_files, *, skip_unreadable: bool = False) -> tuple[Task, str | None]:
    """`task` with its label names filled in from the training split when it declared none,
    and the note that says so (None when nothing was inferred). The names are the values as
    written (`label_text`), in `label_order`; rows are matched to them by value, never by
    position, and no value is an "unlabeled" marker."""
    schema = get_schema(task.dataset)
    if schema.label_field is None or schema.label_names or schema.label_kind == "regression":
        return task, None
    if not train_files:
        raise TaskDeclarationError(f"task {task.name}: list its labels (finetune.task.labels): they are "
                                   "inferred from local training files, and this run has none")
    column = label_values(train_files, schema.label_field, skip_unreadable=skip_unreadable)
    if column.columns and not column.present:
        raise TaskDeclarationError(f"task {task.name}: {_no_column(schema.label_field, column.columns)}")
    values = column.values
    if schema.label_kind == "multi":
        values = [v for row in values for v in (row.split(schema.label_separator) if isinstance(row, str)
                                                else row if isinstance(row, (list, tuple)) else [row])]
    names = label_order(n for n in map(label_text, values) if n)
    if len(names) < (1 if schema.label_kind == "multi" else 2):
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


def _schema(spec, kind: str, problem: str, name: str, where: str) -> DatasetSchema:
    if spec.get("dataset") is not None:
        schema = get_schema(str(spec["dataset"]))
        if spec.get("labels") is not None:
            schema = dataclasses.replace(schema, label_names=tuple(str(x) for x in spec["labels"]))
        return schema
    hub = spec.get("hub")
    common = dict(name=name, hub_path=str(hub) if hub else "", hub_config=spec.get("hub_config"))
    extra = (str(spec["id_field"]),) if spec.get("id_field") else ()
    if kind in ("contrastive", "instruct"):  # read by their recipes (pairs; a built instruction set)
        return DatasetSchema(text_fields=(), label_field=None, **common)
    if kind == "seq2seq":
        return DatasetSchema(text_fields=(str(spec.get("source_field", "source")),), label_field=None,
                             target_field=str(spec.get("target_field", "target")), extra_fields=extra, **common)
    if kind == "span":
        return DatasetSchema(text_fields=(str(spec.get("context_field", "context")),
                                          str(spec.get("question_field", "question"))), label_field=None,
                             answers_field=str(spec.get("answers_field", "answers")),
                             extra_fields=extra or ("id",), **common)
    fields = spec.get("fields")
    if fields is None and kind == "verbalizer" and spec.get("template"):
        from .text_fit import template_fields

        fields = list(template_fields(str(spec["template"]).split("<mask>")[0]))
    fields = tuple(str(f) for f in _list(fields, f"{where}.fields")) if fields is not None else ()
    if not fields:
        raise TaskDeclarationError(f"{where}.fields: name the text column(s) the task reads, e.g. fields: [text]")
    labels = spec.get("labels")
    label_words = spec.get("label_words")
    if labels is None and isinstance(label_words, Mapping):
        labels = list(label_words)
    if labels is not None:
        labels = tuple(label_text(x) or str(x) for x in _list(labels, f"{where}.labels"))  # 1.0 names label 1
        if len(set(labels)) != len(labels) or any(not x for x in labels):
            raise TaskDeclarationError(f"{where}.labels must be distinct non-empty names, got {list(labels)}")
    if problem == "regression" and labels is not None:
        raise TaskDeclarationError(f"{where}: a regression task has a number per row, not labels")
    return DatasetSchema(text_fields=fields, label_names=labels or (), unlabeled=None,
                         label_indices=not any(map(names_a_number, labels or ())),
                         label_field=str(spec.get("label_field", "label")), extra_fields=extra,
                         label_kind=_LABEL_KIND[problem], label_separator=str(spec.get("label_separator", ",")),
                         **common)


def _prompt(spec, schema: DatasetSchema, where: str) -> tuple[VerbalizerPrompt, DatasetSchema]:
    template, words = spec.get("template"), spec.get("label_words")
    if template is None or words is None:
        raise TaskDeclarationError(f"{where}: kind verbalizer needs template (with one <mask>) and "
                                   "label_words (one word per label)")
    if isinstance(words, Mapping):
        missing = [n for n in schema.label_names if n not in words]
        if missing:
            raise TaskDeclarationError(f"{where}.label_words has no word for the label(s) {missing}")
        words = [words[n] for n in schema.label_names]
    elif not schema.label_names:
        raise TaskDeclarationError(f"{where}: label_words as a list needs labels (their order), or give "
                                   "label_words as a mapping {label: word}")
    words = tuple(str(w) for w in _list(words, f"{where}.label_words"))
    if len(words) != len(schema.label_names):
        raise TaskDeclarationError(f"{where}.label_words has {len(words)} words for {len(schema.label_names)} "
                                   f"labels {list(schema.label_names)}")
    truncatable = spec.get("truncatable")
    try:
        prompt = VerbalizerPrompt(str(template), words,
                                  None if truncatable is None else tuple(str(f) for f in truncatable))
    except ValueError as exc:
        raise TaskDeclarationError(f"{where}.template: {exc}") from None
    missing = [f for f in prompt.fields if f not in schema.text_fields]
    if missing and (spec.get("fields") is not None or spec.get("dataset") is not None):
        raise TaskDeclarationError(f"{where}.template uses {missing}, which are not among the fields "
                                   f"{list(schema.text_fields)}")
    if spec.get("dataset") is not None:
        return prompt, schema
    return prompt, dataclasses.replace(schema, text_fields=prompt.fields)


def _columns(spec, kind: str) -> dict:
    if kind == "span":
        return {"context": str(spec.get("context_field", "context")),
                "question": str(spec.get("question_field", "question")),
                "answers": str(spec.get("answers_field", "answers")), "id": str(spec.get("id_field", "id"))}
    return {}


def _score_keys(metrics: Sequence[str]) -> list[str]:
    """The keys the metrics put into the scores (what `select` may name)."""
    from ..metrics.task_scores import score_keys

    return score_keys(metrics)


def _list(value, key: str) -> list:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TaskDeclarationError(f"{key} must be a list, got {value!r}")
    return list(value)
