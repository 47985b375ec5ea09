"""The `finetune:` section of a run config: what task a fine-tuning run learns and how long.

`task` is a built-in task's name (mnli, cb_head, squad, ...) or a task declared as a mapping
(kind, fields, label_field, labels, ...; `finetune/tasks/declaration.py`).

Plain settings only (config/ sits below finetune/, which owns tasks and their kinds). A run
config with `finetune.task` set is run by `python -m megatron_biglm.cli.finetune`, which turns
the epochs into `schedule.train_steps` once it knows the training set's size:

    steps_per_epoch = ceil(train examples / training.global_batch_size)   (rounded UP: the
        last step of an epoch tops up with the first examples of that epoch's shuffle)
    schedule.train_steps  = epochs * steps_per_epoch
    schedule.warmup_steps = round(warmup_fraction * train_steps)
    validation (and a checkpoint) every `validate_every_steps` steps, or every epoch when 0,
    and at the last step.

`data` maps split names to local files (jsonl/parquet, a path, glob or list); a split left
out is read from the HF hub when `hub` is true. `select_metric` defaults to the task's
`select` (e.g. CB: macro_f1), measured on `select_split` (default: the task's first
evaluation split, e.g. MNLI's validation_matched). `test_split`, when given, is scored at
every validation and reported for the best one. `init_from`: a checkpoint (pretraining run, `from-hf` import) whose model weights a fresh
fine-tune starts from (fresh optimizer and schedule). `options`: the task kind's own settings
(its typed `Options`, `finetune/kinds/`: e.g. a verbalizer's `template`, `label_words`,
`loss_over`, `fill_short_labels_with`; a head's `label_names` and `pooling`; span QA's
`doc_stride`; seq2seq's `max_target_length`). A key that now belongs to a kind's options
(`MOVED_KEYS`) is refused under `finetune:` with its new place named; a config.yaml a run saved
before is read through the one migration that moves it there (`migrate_moved_keys`).

A data file that cannot be read to its end (a truncated .gz/.zst) stops the run, naming it;
`skip_unreadable: true` keeps the rows before the damage and counts the rest as one loss.

A run_dir that holds another fine-tune (another task, data by path or content, or settings) is
refused; `overwrite: true` deletes it and starts over, but only a folder holding a fine-tune's
own record, never one that is or holds `init_from` or a pretraining checkpoint
(`run/run_claim.py`). A head `init_from` stores with another shape (a fine-tuned 2-label
head, and a 3-label task) is refused; `reinit_mismatched_heads: true` starts it fresh instead.

Low data (“Scaling Effects of Instruction Tuning” §4.3): `train_examples: N` trains on N examples drawn from the usable
training examples with `data.seed` (reported in results.json's `data`; more than there are is
an error, not a silent cap); `N = 0` trains nothing and scores `init_from` as it is on the
evaluation splits (zero-shot; a kind that scores a pretrained model as it is). `min_steps` lifts the schedule to at least
that many steps (8 examples x 3 epochs would be 3 steps; the seed trains >= 300):
train_steps = max(epochs * steps_per_epoch, min_steps); when min_steps is what decides, the
run validates once, at the end (unless `validate_every_steps` is set), not every "epoch".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from megatron_biglm.common.config_fields import ConfigError

#: the config key naming a fine-tune's start point (every refusal of that checkpoint names it)
INIT_KEY = "finetune.init_from"

#: keys that were `finetune:` settings and belong to one kind now: key -> (kind, its new place)
MOVED_KEYS = {
    "template": ("verbalizer", "finetune.options.template"),
    "label_words": ("verbalizer", "finetune.options.label_words"),
    "loss_over": ("verbalizer", "finetune.options.loss_over"),
    "fill_short_labels_with": ("verbalizer", "finetune.options.fill_short_labels_with"),
    "label_names": ("head", "finetune.options.label_names"),
    "problem_type": ("head", "finetune.task.problem_type"),
}


def refuse_moved_keys(section) -> None:
    """A user's `finetune:` section that still sets a key of one kind (`MOVED_KEYS`): refused,
    naming where it goes now."""
    if not isinstance(section, dict):
        return
    moved = [key for key in section if key in MOVED_KEYS]
    if moved:
        kind, place = MOVED_KEYS[moved[0]]
        raise ConfigError(f"finetune.{moved[0]} is a setting of the task kind {kind!r} now (did you mean "
                          f"{place!r}?): move it there" + (f"; also {', '.join(moved[1:])}" if moved[1:] else ""))


def migrate_moved_keys(section: dict, where: str) -> dict:
    """A saved `finetune:` section (a run's config.yaml, or its run record) with the keys of
    `MOVED_KEYS` moved to their new places, in one step; unset (null) ones were defaults and
    go. A problem type saved beside a task that names another is an error naming `where`."""
    section = dict(section)
    options = dict(section.get("options") or {})
    for key, (_, place) in MOVED_KEYS.items():
        if key not in section:
            continue
        value = section.pop(key)
        if value is None:
            continue
        if key == "problem_type":
            task = section.get("task")
            declared = task.get("problem_type", "single_label_classification") if isinstance(task, dict) else \
                "single_label_classification"
            if value != declared:
                raise ConfigError(f"{where}: finetune.problem_type={value!r} but its task is {declared!r}; set "
                                  f"{place} and remove finetune.problem_type")
            continue
        if options.get(key, value) != value:
            raise ConfigError(f"{where}: finetune.{key}={value!r} and {place}={options[key]!r}; keep one")
        options[key] = value
    if options:
        section["options"] = options
    return section


def split_files_problem(split: str, files) -> str | None:
    """What is wrong with one split's value under `finetune.data`, or None: a path, directory or
    glob, or a non-empty list of them; null leaves the split to the hub (`finetune.hub`)."""
    if files is None:
        return None
    listed = files if isinstance(files, list) else [files]
    bad = [i for i, f in enumerate(listed) if not isinstance(f, str) or not f.strip()]
    if listed and not bad:
        return None
    where = f"finetune.data.{split}" + (f"[{bad[0]}]" if isinstance(files, list) and bad else "")
    value = listed[bad[0]] if bad else files
    if not isinstance(value, (str, list)):  # set in code (derive), not read from YAML: config values are text
        return (f"{where} is a {type(value).__name__} ({value!r}); a config holds paths as strings "
                f"(what its config.yaml saves): pass str(path)")
    return (f"{where}={value!r} names no file: give a path, a directory or a glob, or a list of them "
            f"(e.g. finetune.data.{split}=data/{split}.jsonl)")


@dataclass
class FinetuneConfig:
    task: Any = None   # a built-in task's name, or a task declaration (finetune/tasks/declaration.py)
    data: dict[str, Union[str, list[str], None]] = field(default_factory=dict)   # split -> its files (split_files_problem)
    hub: bool = False
    max_length: int = 256
    epochs: float = 3   # fractional epochs round up to whole steps (finetune/epochs.py)
    warmup_fraction: float = 0.06
    schedule: Literal["linear", "wsd", "cosine", "constant"] = "linear"
    validate_every_steps: int = 0
    select_metric: Optional[str] = None
    select_split: Optional[str] = None
    test_split: Optional[str] = None
    init_from: Optional[str] = None
    eval_batch_size: int = 16
    train_examples: Optional[int] = None
    min_steps: int = 0
    options: dict = field(default_factory=dict)
    overwrite: bool = False
    reinit_mismatched_heads: bool = False   # a head init_from stores with another shape starts fresh (a note says so)
    skip_unreadable: bool = False   # a data file that cannot be read to its end: its rest is one counted loss
    early_stopping_patience: int = 0   # stop after this many validations without a new best (0: never)
    resume_changes: list[str] = field(default_factory=list)   # trajectory settings a resume may change (config/resume_settings.py)

    @property
    def enabled(self) -> bool:
        return bool(self.task)

    def problem(self) -> str | None:
        """What is wrong with these settings, or None."""
        if not self.enabled:
            return None
        if not isinstance(self.task, (str, dict)):
            return (f"finetune.task must be a built-in task's name or a task declaration (a mapping with "
                    f"kind, fields, label_field, ...), got {self.task!r}")
        for split, files in self.data.items():
            problem = split_files_problem(split, files)
            if problem:
                return problem
        if self.epochs <= 0:
            return f"finetune.epochs must be > 0, got {self.epochs}"
        if not 0 <= self.warmup_fraction < 1:
            return f"finetune.warmup_fraction must be in [0, 1), got {self.warmup_fraction}"
        if self.validate_every_steps < 0:
            return f"finetune.validate_every_steps must be >= 0 (0: every epoch), got {self.validate_every_steps}"
        if self.max_length < 8:
            return f"finetune.max_length={self.max_length} is too short for a prompt"
        if self.train_examples is not None and self.train_examples < 0:
            return f"finetune.train_examples must be >= 0 (0: no training, score init_from), got {self.train_examples}"
        if self.min_steps < 0:
            return f"finetune.min_steps must be >= 0, got {self.min_steps}"
        if self.early_stopping_patience < 0:
            return f"finetune.early_stopping_patience must be >= 0 (0: never stop early), got {self.early_stopping_patience}"
        if self.eval_batch_size < 1:
            return f"finetune.eval_batch_size must be >= 1, got {self.eval_batch_size}"
        return None

    def check(self) -> None:
        problem = self.problem()
        if problem:
            raise ConfigError(problem)
