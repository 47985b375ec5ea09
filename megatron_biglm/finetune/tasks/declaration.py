"""A task declared as data: `finetune.task` may be a mapping instead of a built-in name.

    finetune:
      task:
        kind: head                   # a registered kind (finetune/kinds/), or module:Class
        fields: [review]             # the text columns, in order
        label_field: sentiment
        labels: [neg, pos]           # optional: inferred from the training split (sorted)
      data: {train: train.csv, validation: valid.csv}

Every key (`COMMON_KEYS`, and the kind's own `declaration_keys`; an unknown one is an error
naming the valid ones, or the kind it belongs to). The kind reads the declaration: which
problem types it models, its default metrics, the columns it reads and the task fields it
settles are its class's (`kinds/base.py`); this module holds what every kind shares.
  name                 what results and logs call the task (default "custom")
  kind                 how it is modelled (`finetune/kinds/`): verbalizer, head, span, seq2seq,
                       contrastive (pairs under data.train, a BEIR folder per evaluation split),
                       instruct (instruction datasets built by `cli.instruct_data`), or a
                       `module:Class` of one's own
  dataset              a built-in data set's columns (`data_files.SCHEMAS`, e.g. super_glue/cb),
                       instead of declaring them
  fields               the text columns in order (a verbalizer takes them from its template)
  label_field          the label column (default "label")
  labels               the label names, in index order; left out, they are the distinct values
                       of the training split's label column as written (1, "1" and 1.0 are one
                       label), numbers in numeric order, then other names sorted (printed, and
                       saved in the run's config.yaml as finetune.options.label_names). A value is
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

from megatron_biglm.common.config_fields import unknown_key_error

from ..columns import TaskDeclarationError, as_list
from ..data_files import DatasetSchema, get_schema, raw_split
from ..kinds import KINDS, kind_class
from ..kinds.label_inference import infer_labels, needs_labels
from ..metrics.task_scores import score_keys
from .task import Task, check_metric_name

#: the declaration keys of every kind (a kind adds its own: `declaration_keys`)
COMMON_KEYS = ("name", "kind", "dataset", "fields", "label_field", "labels", "problem_type", "label_separator",
               "id_field", "metrics", "select", "train_split", "eval_splits", "hub", "hub_config")


def declare_task(spec: Mapping, where: str = "finetune.task") -> Task:
    """The `Task` a declaration describes (see the module doc). Labels left out stay None on
    the task until `with_labels` fills them from the training split."""
    if not isinstance(spec, Mapping):
        raise TaskDeclarationError(f"{where} must be a task name or a mapping, got {spec!r}")

    kind = spec.get("kind")
    try:
        kind_cls = kind_class(kind)
    except ValueError as exc:
        raise TaskDeclarationError(f"{where}.kind must be one of {list(KINDS)} or a 'module:Class': {exc}") from None
    valid = [*COMMON_KEYS, *kind_cls.declaration_keys]
    unknown = [k for k in spec if k not in valid]
    if unknown:
        owners = {k: other for k in unknown for other in KINDS
                  if other != kind and k in kind_class(other).declaration_keys}
        if owners:
            key, owner = next(iter(owners.items()))
            raise TaskDeclarationError(f"{where}: {key} belongs to kind {owner}, not {kind!r}")

        raise unknown_key_error(where, unknown, valid, error=TaskDeclarationError,
                                headline="unknown task key {first!r}")
    problem = spec.get("problem_type", "single_label_classification")
    if problem not in kind_cls.problem_types:
        raise TaskDeclarationError(f"{where}.problem_type must be one of {list(kind_cls.problem_types)} for kind "
                                   f"{kind!r}, got {problem!r}")
    name = str(spec.get("name", "custom"))
    schema = _schema(spec, kind_cls, problem, name, where)
    schema, settled = kind_cls.declare(spec, schema, where)
    default_metrics, default_select = kind_cls.default_metrics[problem]
    metrics = tuple(str(m) for m in as_list(spec.get("metrics", default_metrics), f"{where}.metrics"))
    for metric in metrics:
        check_metric_name(metric, f"{where}.metrics")
    select = str(spec.get("select", default_select if default_select in _score_keys(metrics) else
                          _score_keys(metrics)[0]))
    if select not in _score_keys(metrics):
        raise TaskDeclarationError(f"{where}.select={select!r} is not a score of the metrics {list(metrics)}; "
                                   f"pick one of {_score_keys(metrics)}")
    eval_splits = tuple(str(s) for s in as_list(spec.get("eval_splits", ["validation"]), f"{where}.eval_splits"))
    dataset = str(spec["dataset"]) if spec.get("dataset") is not None and spec.get("labels") is None else schema
    return Task(name=name, dataset=dataset, kind=kind, metrics=metrics, select=select,
                label_field=schema.label_field, train_split=str(spec.get("train_split", "train")),
                eval_splits=eval_splits, problem_type=problem, **settled)


def with_labels(task: Task, train_files, *, skip_unreadable: bool = False) -> tuple[Task, str | None]:
    """`task` with its label names filled in from the training files when it declared none,
    and the note that says so (None when nothing was inferred): `kinds/label_inference.py`
    over the files read once."""
    if not needs_labels(task):
        return task, None
    return infer_labels(task, raw_split(train_files, skip_unreadable=skip_unreadable) if train_files else None)


def _schema(spec, kind_cls, problem: str, name: str, where: str) -> DatasetSchema:
    """A built-in data set's columns (`dataset`), or those the kind reads from the declaration."""
    if spec.get("dataset") is not None:
        schema = get_schema(str(spec["dataset"]))
        if spec.get("labels") is not None:
            schema = dataclasses.replace(schema, label_names=tuple(str(x) for x in spec["labels"]))
        return schema
    hub = spec.get("hub")
    common = dict(name=name, hub_path=str(hub) if hub else "", hub_config=spec.get("hub_config"))
    return kind_cls.declared_schema(spec, problem, common, where)


def _score_keys(metrics: Sequence[str]) -> list[str]:
    """The keys the metrics put into the scores (what `select` may name)."""
    return score_keys(metrics)
