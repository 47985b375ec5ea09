"""The head kind (“Scaling Effects of Instruction Tuning”'s baseline): pooled encoder states -> a classification head.

An example is `[BOS] text_1 [EOS] text_2 [EOS]` (`HeadEncoder` below), right-padded
to the batch's longest row; no target suffix, so `split` is 0 (full bidirectional attention over
the valid tokens). The model is `BiGLMHeadModel` with the `classification` head (mean over the
valid tokens, or the first token with `finetune.options.pooling: first`; then dense, GELU,
classifier, as HF's EuroBertForSequenceClassification). One loss term per example, averaged
over the global batch's examples, by the task's `problem_type` (HF's names and losses):
  single_label_classification  cross-entropy of the gold label; predicts the argmax
  regression                   one output, MSE against the row's number; predicts the output
  multi_label_classification   one sigmoid per label, binary cross-entropy summed over the
                               labels; predicts every label whose logit is > 0 (p > 0.5)
Validation scores the predictions with the task's metrics. Exports as
the head's HF class (`export.head_export`; EuroBertForSequenceClassification) with config.json's `problem_type` and
`id2label` from the checkpoint's head record (`task_head.json`: the task's problem type, and
`finetune.options.label_names`, which the kind fills in from the data set's schema and writes
into the run config, so its checkpoints carry them; set it to rename the labels).

Features (`HeadEncoder`): `[BOS] text_1 [EOS] text_2 [EOS] ...` (one segment per field, each closed by EOS), no
mask tokens and no target suffix, so `split` is 0 (every position sees every other one).
`length` is the valid length the pooling (mean over valid positions, or the first token)
must respect. When the texts do not fit, the longest segment loses tokens from its end
until they do (longest-first, as HF's `truncation="longest_first"`: on a tie the later
field loses the token); each cut field is
counted once per row in the `RowReport`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, Mapping, Optional, Sequence

import torch

from megatron_biglm.checkpoint.task_head import HeadRecord
from megatron_biglm.config import ConfigError, derive
from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.inference.engine import pad
from megatron_biglm.model.head_model import head_model_provider, head_of_record
from megatron_biglm.model.heads import task_head
from megatron_biglm.training.recipe import LOSS_KEY

from ..data_files import get_schema
from ..metrics import task_scores
from ..metrics.probe import label_probe, label_set_probe, number_probe
from ..row_report import SOURCE_TOO_LONG, RowReport
from .base import LabelRecipe, accuracy_loss, gold_labels


@dataclass
class HeadExample:
    input_ids: list[int]
    length: int
    label: object  # an index; a number (regression); a tuple of indices (multi-label); None: unlabeled
    split: int = 0


class HeadEncoder:
    def __init__(self, tokenizer, fields: Sequence[str], max_length: int):
        self.tokenizer = tokenizer
        self.fields = tuple(fields)
        self.max_length = int(max_length)
        self.ids = TokenIds.from_tokenizer(tokenizer)
        if self.ids.bos_id is None or self.ids.eos_id is None:
            raise ValueError("the tokenizer needs BOS and EOS ids (load it with load_tokenizer)")

    def encode(self, row: Mapping[str, str], label=None, *,
               report: RowReport | None = None, source="", line: int = 0) -> HeadExample | None:
        segments = [list(self.tokenizer(row[f], add_special_tokens=False)["input_ids"])
                    for f in self.fields]
        budget = self.max_length - 1 - len(segments)
        if budget < len(segments):
            if report is not None:
                report.drop_kept(SOURCE_TOO_LONG, source, line,
                                 f"{len(segments)} fields cannot fit in max_length={self.max_length}")
            return None
        cut = set()
        while sum(map(len, segments)) > budget:
            longest = max(range(len(segments)), key=lambda i: (len(segments[i]), i))
            segments[longest].pop()
            cut.add(self.fields[longest])
        if report is not None:
            for field in sorted(cut):
                report.truncate(field)
        ids = [self.ids.bos_id]
        for segment in segments:
            ids += segment + [self.ids.eos_id]
        return HeadExample(ids, len(ids), label)


def collate(examples: Sequence[HeadExample], pad_id: int) -> dict[str, torch.Tensor]:
    """input_ids [B, T] right-padded, lengths [B], labels [B] (-1 where unlabeled)."""
    input_ids, lengths = pad([e.input_ids for e in examples], pad_id, "cpu")
    return {"input_ids": input_ids, "lengths": lengths,
            "labels": torch.tensor([-1 if e.label is None else e.label for e in examples])}


@dataclass
class HeadOptions:
    pooling: Literal["mean", "first"] = "mean"   # over the valid tokens, or the first (BOS) token
    label_names: Optional[list] = None           # what the label indices are called (default: the schema's)
    head: str = "classification"                 # a registered task head returning logits [b, labels]


class HeadClassificationRecipe(LabelRecipe):
    name = "head_classification"
    metric_names = ("accuracy",)
    Options = HeadOptions
    problem_types = ("single_label_classification", "regression", "multi_label_classification")
    default_metrics = {"single_label_classification": (("accuracy",), "accuracy"),
                       "regression": (("pearson", "spearman", "mse"), "pearson"),
                       "multi_label_classification": (("micro_f1", "macro_f1", "subset_accuracy"), "micro_f1")}

    def __init__(self, task, tokenizer, options):
        super().__init__(task, tokenizer, options)
        schema = get_schema(task.dataset)
        self.problem_type = task.problem_type
        if self.problem_type != "single_label_classification":
            self.metric_names = ()  # the loss report carries an accuracy for single labels only
        if self.problem_type == "regression":
            self.label_names, self.num_labels = [schema.label_field or "score"], 1
        else:
            self.label_names = list(self.opts.label_names or schema.label_names)
            self.num_labels = len(schema.label_names)
        names = self.opts.label_names
        if names is not None and (not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names)):
            raise ConfigError(f"finetune.options.label_names must be distinct non-empty strings, got {names}: "
                              "quote them (YAML reads yes/no/true/false unquoted as booleans)")
        if len(self.label_names) != self.num_labels:
            raise ValueError(f"finetune.options.label_names names {len(self.label_names)} labels "
                             f"({self.label_names}); task {task.name} has {self.num_labels}: give one name per label")
        self.pooling = self.opts.pooling
        try:
            task_head(self.opts.head)
        except ValueError as exc:
            raise ConfigError(f"finetune.options.head: {exc}") from None
        self.pad_id = TokenIds.from_tokenizer(tokenizer).pad_id
        self.encoder = HeadEncoder(tokenizer, schema.text_fields, options.max_length)

    def encode(self, rows: list[dict], report: RowReport, training: bool) -> list:  # noqa: ARG002
        return self.encode_labelled(self.encoder, rows, report)

    def task_head(self) -> HeadRecord:
        return HeadRecord(self.opts.head, self.num_labels, self.pooling, self.problem_type, tuple(self.label_names))

    def settle(self, config):
        """The label names written into `finetune.options`, so the run's config.yaml names them."""
        options = {**config.finetune.options, "label_names": list(self.label_names)}
        return derive(config, finetune=dataclasses.replace(config.finetune, options=options))

    def model_provider(self, pre_process, post_process, config, transformer_config):
        return head_model_provider(*head_of_record(self.task_head()))(
            pre_process, post_process, config, transformer_config)

    def collate(self, examples: Sequence) -> dict:
        """Right-padded to the batch's longest row (not to max_length: a head reads the valid
        tokens only, so the width changes nothing but the cost)."""
        width = max(e.length for e in examples)
        tokens = torch.full((len(examples), width), self.pad_id, dtype=torch.long)
        for i, e in enumerate(examples):
            tokens[i, :e.length] = torch.tensor(e.input_ids)
        return {"tokens": tokens, "valid_lengths": torch.tensor([e.length for e in examples]),
                "labels": self._labels(examples)}

    def _labels(self, examples: Sequence) -> torch.Tensor:
        if self.problem_type == "regression":
            return torch.tensor([float("nan") if e.label is None else float(e.label) for e in examples])
        if self.problem_type == "multi_label_classification":
            hot = torch.zeros(len(examples), self.num_labels)
            for i, e in enumerate(examples):
                if e.label is None:
                    hot[i] = float("nan")
                else:
                    hot[i, list(e.label)] = 1.0
            return hot
        return torch.tensor([-1 if e.label is None else e.label for e in examples])

    def _loss(self, batch: dict, logits: torch.Tensor):
        if self.problem_type == "single_label_classification":
            labels = gold_labels(batch, logits.device)
            loss_sum = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
            return accuracy_loss(loss_sum, logits, labels)
        target = batch["labels"].to(logits.device)
        if bool(torch.isnan(target).any()):
            raise ValueError("an unlabeled example reached the training loss")
        if self.problem_type == "regression":
            loss_sum = torch.nn.functional.mse_loss(logits.float()[:, 0], target, reduction="sum")
        else:
            loss_sum = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), target, reduction="sum")
        count = torch.tensor(target.shape[0], dtype=torch.int, device=logits.device)
        return loss_sum, count, {LOSS_KEY: torch.stack([loss_sum.detach(), count.float()])}

    def prediction(self, scores: torch.Tensor) -> list:
        """What one batch's logits predict, per example (see the module doc)."""
        if self.problem_type == "regression":
            return [float(x) for x in scores[:, 0].tolist()]
        if self.problem_type == "multi_label_classification":
            return [tuple(int(i) for i in torch.nonzero(row > 0).flatten().tolist()) for row in scores]
        return [int(x) for x in scores.argmax(-1).tolist()]

    def evaluate_split(self, model, name: str, examples: list, device) -> dict[str, float]:  # noqa: ARG002
        predictions = self.predict(model, examples, device, self.options.eval_batch_size)
        return task_scores(self.task.metrics, predictions, [e.label for e in examples],
                           classes=list(range(self.num_labels)))

    def metric_probe(self):
        if self.problem_type == "regression":
            return number_probe()
        if self.problem_type == "multi_label_classification":
            return label_set_probe(self.num_labels)
        return label_probe(self.num_labels)

    @property
    def num_classes(self) -> int:
        return self.num_labels
