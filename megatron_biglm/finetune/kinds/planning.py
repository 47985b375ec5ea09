"""A kind's plan: everything the task's kind settles before anything is built, in one typed
`KindPlan` that the run's planner (`run/plan.py`) asks for once.

`plan_kind` checks that every split's files exist in an accepted format, reads the training
split once when the task lists no labels (its labels are inferred from those rows,
`label_inference.py`, and the same rows are then checked and encoded), builds the kind's recipe,
checks its metrics and calls every user metric once on a fake prediction set, reads and encodes
every split (`prepare`), and turns the epochs into the run's schedule (`schedule.py`) with what
the kind settles in the config (`settle`: a head's label names, the length head's size). A bad
file, row, option or metric is a `ConfigError` naming the task before the first step.

`finetune.train_examples=0` plans no training, for a kind that scores a model zero-shot
(`refuse_untrained_scoring`, which the run's planner asks before any file is read): no
schedule (`train_steps` 0, the config as given) and a validator that scores the start point
once.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from megatron_biglm.common.config_fields import ConfigError, unknown_key_error
from megatron_biglm.config import RunConfig

from ..data_files import check_split_files, raw_split
from ..epochs import train_steps
from ..metrics.task_scores import score_keys, user_metric
from ..schedule import derived_schedule
from ..validation import TaskValidator, probe_user_metrics
from . import KINDS, kind_class
from .base import FinetuneRecipe
from .label_inference import infer_labels, needs_labels


@dataclass
class KindPlan:
    """The task's kind, planned: the run config it trains with (its schedule and what the kind
    settled), its recipe with every split read and encoded, the task as the recipe holds it
    (labels inferred when the declaration listed none), the kind's typed `Options`, its label
    names (empty for a kind without labels), the validator, the schedule in steps (0: no
    training) and the lines to print."""
    config: RunConfig
    recipe: FinetuneRecipe
    task: object
    options: object
    validator: TaskValidator
    steps_per_epoch: int
    train_steps: int
    labels: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)


def plan_kind(task, tokenizer, config: RunConfig) -> KindPlan:
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
    probe_user_metrics(recipe)  # a user metric called once on a fake prediction set: before any step
    labels = tuple(getattr(task.dataset, "label_names", ()))
    notes = [labels_note] if labels_note else []
    notes += [f"{name}: {line}" for name, line in recipe.row_summaries().items()]
    if options.train_examples == 0:
        interval, per_epoch, steps = 1, 0, 0
        notes.append(f"finetune.train_examples=0: no training; {options.init_from} is scored as it is "
                     f"on {', '.join(recipe.eval_split_names())}")
    else:
        gbs, n_train = config.training.global_batch_size, len(recipe.train_examples)
        config = recipe.settle(derived_schedule(config, n_train))
        interval = config.checkpoint.save_interval  # a checkpoint at every task validation
        steps, per_epoch = config.schedule.train_steps, recipe.steps_per_epoch(gbs)
        notes += [f"dropped {line}" for line in recipe.row_details()]
        lifted = (f", lifted to finetune.min_steps={options.min_steps}"
                  if steps > train_steps(n_train, options.epochs, gbs) else "")
        notes.append(f"{n_train} training examples / global batch {gbs} = {per_epoch} steps per epoch (rounded up) "
                     f"x {options.epochs} epochs{lifted} = {steps} steps; validation every {interval} steps")
    # a zero-shot run's one validation, at step 0, is reported against a one-step epoch
    validator = TaskValidator(recipe, interval=interval, steps_per_epoch=max(per_epoch, 1), train_steps=steps,
                              run_dir=config.run_dir, checkpoint_root=config.checkpoint_dir,
                              data_summary=recipe.row_summaries())
    return KindPlan(config, recipe, task, recipe.opts, validator, per_epoch, steps, labels, notes)


def refuse_untrained_scoring(task) -> None:
    """`finetune.train_examples=0` scores a model as it is, which needs a kind that reads
    answers off the pretrained model (its `scores_zero_shot`); a head would be untrained."""
    try:
        scores = kind_class(task.kind).scores_zero_shot
    except ValueError as exc:
        raise ConfigError(f"finetune.task {task.name}: {exc}") from None
    if not scores:
        zero_shot = [name for name in KINDS if kind_class(name).scores_zero_shot]
        raise ConfigError(f"finetune.train_examples=0 scores a model zero-shot, which needs a task read off the "
                          f"pretrained model (kind {' or '.join(zero_shot)}); {task.name} is kind "
                          f"{task.kind!r}: its head would be untrained. Use finetune.train_examples >= 1")


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
