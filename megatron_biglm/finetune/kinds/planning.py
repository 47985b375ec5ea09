"""A kind's plan: everything the task's kind settles before anything is built, in one typed
`KindPlan` that the run's planner (`run/plan.py`) asks for once.

`plan_kind` checks that every split's files exist in an accepted format, reads the training split once when the task lists no labels (its labels are
inferred from those rows, `label_inference.py`, and the same rows are then checked and encoded),
builds the kind's recipe, checks its metrics, and reads and encodes every split (`prepare`):
a bad file, row or option is a `ConfigError` naming the task before the first step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from megatron_biglm.common.config_fields import ConfigError, unknown_key_error

from ..data_files import check_split_files, raw_split
from ..metrics.task_scores import score_keys, user_metric
from . import kind_class
from .base import FinetuneRecipe
from .label_inference import infer_labels, needs_labels


@dataclass
class KindPlan:
    """The task's kind, planned: its recipe with every split read and encoded, the task as the
    recipe holds it (labels inferred when the declaration listed none), the kind's typed
    `Options`, its label names (empty for a kind without labels) and the lines to print."""
    recipe: FinetuneRecipe
    task: object
    options: object
    labels: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)


def plan_kind(task, tokenizer, config) -> KindPlan:
    """The `KindPlan` of `task` for the run `config` (its `finetune:` section is the recipe's
    options), with `tokenizer` the run's."""
    options = config.finetune
    read = {k: v for k, v in options.data.items() if k != task.train_split or options.train_examples != 0}
    check_split_files(read, [task.train_split, *task.eval_splits, options.select_split, options.test_split])
    labels_note = None
    if needs_labels(task):
        files = options.data.get(task.train_split)
        try:  # a file that cannot be read to its end, a missing label column, one label
            train = raw_split(files, skip_unreadable=options.skip_unreadable) if files else None
            task, labels_note = infer_labels(task, train)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    else:
        train = None
    try:
        recipe = kind_class(task.kind)(task, tokenizer, options)
    except ValueError as exc:
        raise ConfigError(f"finetune.task {task.name}: {exc}") from None
    if train is not None and options.train_examples != 0:
        recipe.read[task.train_split] = train
    check_metrics(recipe)
    try:
        recipe.prepare(config)  # every split read and checked before anything trains
    except ConfigError:
        raise
    except ValueError as exc:  # a file in no accepted format, a JSON array, a bad row under strict
        raise ConfigError(f"task {task.name}: {exc}") from None
    notes = [labels_note] if labels_note else []
    return KindPlan(recipe, task, recipe.opts, tuple(getattr(task.dataset, "label_names", ())), notes)


def check_metrics(recipe) -> None:
    """Before any step: every user metric (`module:function`) imports, and `select_metric` is
    a score the task reports (else the first validation, after training, would fail)."""
    metrics = recipe.task.metrics
    for name in metrics:
        if ":" in name:
            try:
                user_metric(name)
            except ValueError as exc:
                raise ConfigError(f"task {recipe.task.name}: {exc}") from None
    known = score_keys(metrics)
    returns_a_dict = any(":" in name for name in metrics)  # a user function's keys are known once it runs
    if recipe.select_split is not None and recipe.select_metric not in known and not returns_a_dict:
        raise unknown_key_error("finetune.select_metric", [recipe.select_metric], known,
                                headline=f"finetune.select_metric={recipe.select_metric!r} is not a score of "
                                         f"task {recipe.task.name}")
