"""`FinetuneRecipe`: what every task kind shares, on top of the training `Recipe`.

A kind (`kinds/__init__.py`) is one subclass in one module. Before any run it reads a task
declaration (`tasks/declaration.py` asks it): the keys of its own (`declaration_keys`), the
problem types it models, its default metrics, the columns it reads (`declared_schema`) and
the task fields it settles (`declare`), checked again on every `Task` (`check_task`);
`scores_zero_shot` says whether it reads answers off a pretrained model unchanged (a
`finetune.train_examples=0` run scores the start point).

Built as `KindClass(task, tokenizer, options)`, the one form of every kind (`options`: the
run config's `finetune:` section, `config.finetune_section.FinetuneConfig`). Its kind-specific
`finetune.options` are typed: each kind names a dataclass (`Options`), built by the config
loader's one mechanism, so an unknown or mistyped option stops the run naming the valid ones;
the kind reads them as `self.opts`. `prepare(config)` reads and encodes every split once (before the
schedule exists: the epochs become steps from the training set's size); `build_data` then
serves the encoded examples to the loop:

  * train: `epochs.EpochSamples`, the one epoch order of every recipe (a fresh seeded
    permutation per epoch, the last step topping up from it; a pure function of the global
    sample index, so `consumed_samples` resumes it exactly).
  * valid: none: a fine-tune is validated by its task metrics (`validation.TaskValidator`),
    not by a validation-loss pass.

A subclass sets `collate(examples) -> batch`, `forward`, `loss_tokens` (the `Recipe` seam)
and `evaluate_split(model, name, examples, device) -> {metric: value}` (must contain the
task's select metric) and `encode(rows, report, training) -> examples`.
`forward` defaults to `logits(model, batch, device)` (the full-attention forward over the
padded `tokens` and their `valid_lengths`) with the loss `_loss(batch, logits)`;
`gold_labels` and `accuracy_loss` are the labelled recipes' shared loss pieces.
`finetune.train_examples: N` keeps N of the encoded training examples (`draw_examples`, seeded
by `data.seed`; the draw is reported beside the row counts); N = 0 reads no training split.
The validation history (per-validation metrics, the best so far) is this recipe's training
state: it is saved in every checkpoint and restored on resume, so a resumed run's
results.json equals an uninterrupted run's.
"""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Sequence

import numpy as np
import torch

from megatron_biglm.checkpoint.task_head import TASK_HEAD_FILE, task_head_text
from megatron_biglm.common.config_fields import build_dataclass
from megatron_biglm.config import ConfigError
from megatron_biglm.config.finetune_section import FinetuneConfig
from megatron_biglm.training.recipe import LOSS_KEY, Recipe, RecipeData

from ..columns import labelled_schema
from ..data_files import DatasetSchema, RawSplit, check_rows, get_schema, load_split
from ..epochs import EpochSamples
from ..epochs import steps_per_epoch as epoch_steps
from ..metrics import task_scores
from ..metrics.probe import label_probe
from ..row_report import RowReport


def draw_examples(examples: Sequence, n: int, seed: int) -> list:
    """`n` of `examples` without replacement, in their original order: the first `n` of one
    permutation seeded by `seed`, so a seed's smaller draws are subsets of its larger ones
    (a low-data curve over N adds examples instead of swapping them)."""
    if n > len(examples):
        raise ConfigError(f"finetune.train_examples={n} but the training split has only {len(examples)} usable "
                          f"examples; ask for at most {len(examples)}")
    keep = np.random.default_rng(seed).permutation(len(examples))[:n]
    return [examples[i] for i in sorted(keep.tolist())]


def gold_labels(batch: dict, device) -> torch.Tensor:
    """The batch's gold labels on `device`; an unlabeled example (-1) is an error in training."""
    labels = batch["labels"].to(device)
    if bool((labels < 0).any()):
        raise ValueError("an unlabeled example reached the training loss")
    return labels


def accuracy_loss(loss_sum: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor):
    """`(loss_sum, count, report)` for one loss term per example, with the argmax accuracy of `scores`."""
    count = torch.tensor(labels.numel(), dtype=torch.int, device=scores.device)
    correct = (scores.argmax(-1) == labels).sum().float().detach()
    return loss_sum, count, {LOSS_KEY: torch.stack([loss_sum.detach(), count.float()]),
                             "accuracy": torch.stack([correct, count.float()])}


@dataclasses.dataclass
class NoOptions:
    """A kind without options of its own."""


def typed_options(cls, options, kind: str):
    """`finetune.options` as the kind's `Options` dataclass (unknown keys and bad values raise
    ConfigError naming `finetune.options.KEY` and the valid keys)."""
    return build_dataclass(cls, dict(options or {}), "finetune.options",
                           headline=f"unknown option {{first!r}} for task kind {kind!r}")


class FinetuneRecipe(Recipe):
    name = "finetune"
    Options: type = NoOptions

    # ---- the kind, before any run: what a declaration of it may say -------------------
    scores_zero_shot: bool = False   # answers read off the pretrained model: train_examples=0 scores it
    declaration_keys: tuple[str, ...] = ()   # the declaration keys of this kind alone
    problem_types: tuple[str, ...] = ("single_label_classification",)
    default_metrics: dict = {"single_label_classification": (("accuracy",), "accuracy")}  # -> (metrics, select)
    reads_columns: bool = True   # False: its data has a format of its own, not a task's columns

    @classmethod
    def declared_schema(cls, spec, problem: str, common: dict, where: str):
        """The columns a declaration of this kind names (a `DatasetSchema`; `common`: its name and
        hub keys). By default: the text `fields` and a label column; none without `reads_columns`."""
        if not cls.reads_columns:
            return DatasetSchema(text_fields=(), label_field=None, **common)
        return labelled_schema(spec, problem, common, where)

    @classmethod
    def declare(cls, spec, schema, where: str) -> tuple:
        """(schema, the `Task` fields this kind settles from the declaration `spec`); by
        default the text fields, in order."""
        return schema, {"fields": tuple(schema.text_fields)}

    @classmethod
    def check_task(cls, task) -> None:
        """What every `Task` of this kind must hold (ValueError naming the task otherwise)."""
        if task.prompt is not None:
            raise ValueError(f"task {task.name}: kind {task.kind!r} takes no prompt")

    def __init__(self, task, tokenizer, options):
        if not isinstance(options, FinetuneConfig):
            raise TypeError(f"a fine-tuning recipe takes the run config's finetune section "
                            f"(config.finetune_section.FinetuneConfig), got {type(options).__name__}; "
                            "e.g. FinetuneConfig(task=..., options={...})")
        self.task, self.tokenizer, self.options = task, tokenizer, options
        self.opts = typed_options(self.Options, options.options, task.kind)
        self.train_examples: list = []
        self.eval_examples: dict[str, list] = {}   # split name -> examples (selection split first)
        self.eval_rows: dict[str, list] = {}
        self.reports: dict[str, RowReport] = {}
        self.history: list[dict] = []               # one record per validation
        self.use_split = True
        self.draw_note: str | None = None           # what finetune.train_examples kept
        self.read: dict[str, RawSplit] = {}         # splits read before the recipe was built (its plan)

    # ---- data -------------------------------------------------------------------------
    @property
    def schema(self):
        return get_schema(self.task.dataset)

    @property
    def select_split(self) -> str | None:
        """The split whose `select_metric` picks the best checkpoint (None: the task has no
        evaluation split, so the run trains without validating)."""
        return self.options.select_split or (self.task.eval_splits[0] if self.task.eval_splits else None)

    @property
    def select_metric(self) -> str:
        return self.options.select_metric or self.task.select

    def eval_split_names(self) -> list[str]:
        if self.select_split is None:
            return []
        return [self.select_split] + [s for s in self.task.eval_splits if s != self.select_split]

    def rows(self, split: str, *, require_labels: bool = True) -> tuple[list[dict], RowReport]:
        files = self.options.data.get(split)
        if not files and not self.options.hub:
            raise ConfigError(f"task {self.task.name}: no data for split {split!r}; set finetune.data.{split}="
                              f"FILES (jsonl, csv, tsv or parquet with the columns {list(self.schema.required)}"
                              f"{' and ' + repr(self.schema.label_field) if self.schema.label_field else ''}), "
                              "or finetune.hub=true")
        if split in self.read:  # read once, for the labels: checked now, not read again
            return check_rows(self.read.pop(split), self.task.dataset, require_labels=require_labels)
        return load_split(self.task.dataset, files=files, split=split, require_labels=require_labels,
                          skip_unreadable=self.options.skip_unreadable)

    def encode(self, rows: list[dict], report: RowReport, training: bool) -> list:
        """The examples of `rows` (a row may give none, counted in `report`, or several)."""
        raise NotImplementedError

    def encode_labelled(self, encoder, rows: Sequence[dict], report: RowReport | None) -> list:
        """One example per row from `encoder.encode(row, label, ...)`, the row's label read from
        the task's label column; a row located as `<task>:<row number>` in the report."""
        out = []
        for number, row in enumerate(rows, start=1):
            example = encoder.encode(row, row.get(self.task.label_field), source=self.task.name,
                                     report=report, line=number)
            if example is not None:
                out.append(example)
        return out

    def prepare(self, config) -> None:
        """Read and encode the training split and every evaluation split (once)."""
        self.use_split = config.objective.resolved.restricts_attention
        wanted = self.options.train_examples
        if wanted != 0:
            rows, report = self.rows(self.task.train_split)
            self.train_examples = self.encode(rows, report, training=True)
            self.reports[self.task.train_split] = report
            self._refuse_empty(self.task.train_split, self.train_examples, report)
            if wanted is not None:
                usable = len(self.train_examples)
                self.train_examples = draw_examples(self.train_examples, wanted, config.data.seed)
                self.draw_note = (f"{wanted} of {usable} usable examples drawn with data.seed="
                                  f"{config.data.seed} (finetune.train_examples)")
        names = self.eval_split_names()
        if self.options.test_split:
            names.append(self.options.test_split)
        for name in names:
            rows, report = self.rows(name)
            self.eval_rows[name] = rows
            self.eval_examples[name] = self.encode(rows, report, training=False)
            self.reports[name] = report
            self._refuse_empty(name, self.eval_examples[name], report)

    def _refuse_empty(self, split: str, examples: list, report: RowReport) -> None:
        """A split without one usable row stops the run before training, saying why its rows
        were dropped (the first of each reason, with file and line) and what the task reads."""
        if examples:
            return

        schema = self.schema
        wants = [*schema.required, *([schema.label_field] if schema.label_field else [])]
        labels = (f"; labels: {list(schema.label_names)}" if schema.label_names else "")
        shown = "\n  ".join([*report.no_rows_lines(), *report.example_lines()])
        if not report.rows_seen:
            shown = (shown + "\n  " if shown else "") + "(no rows at all: is the file empty?)"
        raise ConfigError(f"task {self.task.name}: finetune.data.{split} has no usable row "
                          f"({report.summary_line()}):\n  {shown}\nThe task reads the columns {wants}{labels}")

    def row_details(self) -> list[str]:
        """The first dropped rows of every split, with file, line and reason."""
        return [f"{name}: {line}" for name, report in self.reports.items() for line in report.example_lines()]

    def row_summaries(self) -> dict[str, str]:
        out = {name: report.summary_line() for name, report in self.reports.items()}
        if self.draw_note:
            out["train_examples"] = self.draw_note
        return out

    def steps_per_epoch(self, global_batch_size: int) -> int:
        return epoch_steps(len(self.train_examples), global_batch_size)

    def task_head(self):
        """The record its checkpoints carry (`checkpoint/task_head.py`: a head's or an
        embedder's), or None for a masked-LM model."""
        return None

    def checkpoint_files(self) -> dict[str, str]:
        """Every checkpoint of the fine-tune seals its task-head record (`task_head.json`)."""
        record = self.task_head()
        return {} if record is None else {TASK_HEAD_FILE: task_head_text(record)}

    def settle(self, config):
        """The run config with what this recipe settles (e.g. the head's label names) written
        into its typed sections (`config.derive`), so that the run's config.yaml and its
        checkpoints carry them; `config` as it is when the kind settles nothing."""
        return config

    def build_data(self, config, model_config, dp_size: int) -> RecipeData:  # noqa: ARG002
        if not self.train_examples:
            self.prepare(config)
        gbs = config.training.global_batch_size
        train = EpochSamples(self.train_examples, gbs, config.schedule.train_steps * gbs, config.data.seed)
        return RecipeData(train=train, valid=None, tokenizer=self.tokenizer, collate_fn=self.collate)

    def collate(self, examples: Sequence) -> dict:
        raise NotImplementedError

    # ---- loss -------------------------------------------------------------------------
    def logits(self, model, batch: dict, device) -> torch.Tensor:
        # the lengths stay on the host: the model checks them there and moves what it needs
        return model(batch["tokens"].to(device), split=None, valid_lengths=batch["valid_lengths"])

    def forward(self, model, batch: dict, device):
        return self.logits(model, batch, device), partial(self._loss, batch)

    def _loss(self, batch: dict, logits: torch.Tensor):
        raise NotImplementedError

    # ---- validation -------------------------------------------------------------------
    def evaluate_split(self, model, name: str, examples: list, device) -> dict[str, float]:
        raise NotImplementedError

    def metric_probe(self):
        """A small fake prediction set shaped as `evaluate_split` hands the task's metrics
        (`metrics/probe.py`), to call a user metric once before training; None: none to call."""
        return None

    def state_dict(self) -> dict:
        return {"history": self.history} if self.history else {}

    def load_state_dict(self, state: dict) -> None:
        self.history = list(state.get("history", []))


class LabelRecipe(FinetuneRecipe):
    """A recipe that predicts one of `num_classes` labels per example: the argmax of
    `scores(batch, logits)` (the logits by default), scored by the task's metrics."""

    num_classes: int

    def scores(self, batch: dict, logits: torch.Tensor) -> torch.Tensor:  # noqa: ARG002 - per kind
        return logits

    def loss_tokens(self, batch: dict) -> int:
        return int(batch["labels"].shape[0])

    def prediction(self, scores: torch.Tensor) -> list:
        """The predicted label of each example of a batch: the argmax of its scores."""
        return [int(x) for x in scores.argmax(-1).tolist()]

    @torch.no_grad()
    def predict(self, model, examples: Sequence, device, batch_size: int) -> list:
        out: list = []
        for start in range(0, len(examples), batch_size):
            batch = self.collate(examples[start:start + batch_size])
            out.extend(self.prediction(self.scores(batch, self.logits(model, batch, device))))
        return out

    def evaluate_split(self, model, name: str, examples: list, device) -> dict[str, float]:  # noqa: ARG002
        predictions = self.predict(model, examples, device, self.options.eval_batch_size)
        return task_scores(self.task.metrics, predictions, [e.label for e in examples],
                           classes=list(range(self.num_classes)))

    def metric_probe(self):
        return label_probe(self.num_classes)
