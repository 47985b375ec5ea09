"""Prompted classification (the paper's MNLI setting, seed 001's prompted paradigm): the
masked-LM head predicts the label word at the `<mask>` slot(s) of a prompt.

An example is `[BOS] prompt [MASK]*K rest [EOS]` (`tasks/verbalizer.py`); `split` is the
first mask slot, so the prompt rows never see the answer slots, as in pretraining (0, full
attention, when the run's objective has no split restriction, e.g. an `mlm` baseline).
Label l scores sum_k log p(token_{l,k} at slot k); the loss is the cross-entropy of the gold
label over these scores (`finetune.loss_over: labels`) or the full-vocabulary NLL of its
tokens (`vocab`), one term per example, averaged over the global batch's examples. The
prediction is the argmax over labels; validation scores it with the task's metrics
(`metrics.task_scores`: accuracy, CB's macro-F1).

Template and label words come from the task (`tasks/prompts.py`) unless the config sets
`finetune.template` and `finetune.label_words`.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from ..tasks import VerbalizerPrompt, label_scores
from ..tasks.verbalizer import VerbalizerEncoder
from .base import LabelRecipe, accuracy_loss, gold_labels


class VerbalizerRecipe(LabelRecipe):
    name = "verbalizer"
    metric_names = ("accuracy",)

    def __init__(self, task, tokenizer, options):
        if options.template is not None:
            prompt = VerbalizerPrompt(options.template, tuple(str(w) for w in options.label_words))
            task = dataclasses.replace(task, prompt=prompt, fields=prompt.fields)
        super().__init__(task, tokenizer, options)
        self.encoder = VerbalizerEncoder(tokenizer, task.prompt, options.max_length,
                                         fill_short_labels_with=options.fill_short_labels_with)
        self.slot_targets = self.encoder.slot_targets
        self.pad_id = self.encoder.ids.pad_id

    def encoder_options(self, training: bool) -> dict:  # noqa: ARG002
        return {"fill_short_labels_with": self.options.fill_short_labels_with}

    def collate(self, examples: Sequence) -> dict:
        """Right-padded to `finetune.max_length` (one shape for every batch)."""
        width = self.options.max_length
        tokens = torch.full((len(examples), width), self.pad_id, dtype=torch.long)
        for i, e in enumerate(examples):
            tokens[i, :len(e.input_ids)] = torch.tensor(e.input_ids)
        split = [e.split if self.use_split else 0 for e in examples]
        return {"tokens": tokens, "valid_lengths": torch.tensor([len(e.input_ids) for e in examples]),
                "split": torch.tensor(split), "mask_positions": torch.tensor([e.mask_positions for e in examples]),
                "labels": torch.tensor([-1 if e.label is None else e.label for e in examples])}

    def logits(self, model, batch: dict, device) -> torch.Tensor:
        return model(batch["tokens"].to(device), split=batch["split"],
                     valid_lengths=batch["valid_lengths"].to(device), runtime_gather_output=True)

    def _loss(self, batch: dict, logits: torch.Tensor):
        scores = self.scores(batch, logits)
        labels = gold_labels(batch, logits.device)
        if self.options.loss_over == "labels":
            per_example = torch.nn.functional.cross_entropy(scores, labels, reduction="none")
        else:
            per_example = -scores.gather(1, labels.unsqueeze(1)).squeeze(1)
        return accuracy_loss(per_example.sum(), scores, labels)

    def scores(self, batch: dict, logits: torch.Tensor) -> torch.Tensor:
        return label_scores(logits, batch["mask_positions"].to(logits.device), self.slot_targets)

    @property
    def num_classes(self) -> int:
        return len(self.task.prompt.label_words)
