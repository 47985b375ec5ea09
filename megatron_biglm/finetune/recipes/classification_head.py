"""Head classification (seed 001's baseline): pooled encoder states -> a classification head.

An example is `[BOS] text_1 [EOS] text_2 [EOS]` (`tasks/head_classification.py`), right-padded
to `finetune.max_length`; no target suffix, so `split` is 0 (full bidirectional attention over
the valid tokens). The model is `BiGLMHeadModel` with the `classification` head (mean over the
valid tokens, or the first token with `finetune.options.pooling: first`; then dense, GELU,
classifier, as HF's EuroBertForSequenceClassification). Loss: cross-entropy of the gold label,
one term per example, averaged over the global batch's examples. Validation scores the argmax
with the task's metrics (accuracy, macro-F1 for CB). Exports as EuroBertForSequenceClassification
(`export.head_export`) with config.json's `id2label` named by `finetune.label_names` (the data
set's label names unless set; the recipe writes them into the run config, so its checkpoints
carry them).
"""
from __future__ import annotations

from typing import Sequence

import torch

from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.model.head_model import head_model_provider

from ..data_files import get_schema
from .base import LabelRecipe, accuracy_loss, gold_labels


class HeadClassificationRecipe(LabelRecipe):
    name = "head_classification"
    metric_names = ("accuracy",)

    def __init__(self, task, tokenizer, options):
        super().__init__(task, tokenizer, options)
        self.label_names = list(options.label_names or get_schema(task.dataset).label_names)
        self.num_labels = len(get_schema(task.dataset).label_names)
        if len(self.label_names) != self.num_labels:
            raise ValueError(f"finetune.label_names names {len(self.label_names)} labels "
                             f"({self.label_names}); {task.dataset} has {self.num_labels}: give one name per label")
        self.pooling = str(options.get("pooling", "mean"))
        if self.pooling not in ("mean", "first"):
            raise ValueError(f"finetune.options.pooling must be 'mean' or 'first', got {self.pooling!r}")
        self.pad_id = TokenIds.from_tokenizer(tokenizer).pad_id

    @property
    def head_options(self) -> dict:
        return {"num_labels": self.num_labels, "pooling": self.pooling}

    def derived_settings(self) -> dict:
        return {"finetune.label_names": self.label_names}

    def model_provider(self, pre_process, post_process, config, transformer_config):
        return head_model_provider("classification", self.head_options)(
            pre_process, post_process, config, transformer_config)

    def collate(self, examples: Sequence) -> dict:
        width = self.options.max_length
        tokens = torch.full((len(examples), width), self.pad_id, dtype=torch.long)
        for i, e in enumerate(examples):
            tokens[i, :e.length] = torch.tensor(e.input_ids)
        return {"tokens": tokens, "valid_lengths": torch.tensor([e.length for e in examples]),
                "labels": torch.tensor([-1 if e.label is None else e.label for e in examples])}

    def _loss(self, batch: dict, logits: torch.Tensor):
        labels = gold_labels(batch, logits.device)
        loss_sum = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
        return accuracy_loss(loss_sum, logits, labels)

    @property
    def num_classes(self) -> int:
        return self.num_labels
