"""The verbalizer kind: prompted classification (the paper's MNLI setting, “Scaling Effects of Instruction Tuning”'s prompted
paradigm). The masked-LM head predicts the label word at the `<mask>` slot(s) of a prompt, so
the pretrained model already answers: this kind scores zero-shot.

The prediction is the argmax over labels; validation scores it with the task's metrics
(`metrics.task_scores`: accuracy, CB's macro-F1). The template and label words come from the
task (its declaration: `template`, `label_words`, `truncatable`; the built-ins in
`tasks/prompts.py`) unless the run sets `finetune.options.template` and `label_words`
(`VerbalizerOptions`, with `loss_over` and `fill_short_labels_with`).

Layout of one example (T = max_length at most):

    [BOS] prompt-before-<mask> [MASK] * K  prompt-after-<mask> [EOS]
                               ^ split = 1 + len(prompt-before ids) = first mask slot

`split` is where the answer starts, as in pretraining: prompt rows never see the answer
slots (or anything after them), so the label is read off the slots without the prompt's
states depending on them.

Multi-token label words. Label word l tokenises (with the whitespace that precedes `<mask>`
in the template, e.g. " yes" for byte-level BPE) to n_l tokens; the template gets
K = max_l n_l mask slots. The score of label l is the one-shot rule of the zero-shot
scorer (`evaluation/scoring/oneshot.py`):

    score(l) = sum_{k < n_l} log p(t_{l,k} at slot k | all K slots masked)

Slots k >= n_l are not scored for label l (target IGNORE_INDEX), unless the prompt sets
`fill_short_labels_with` (e.g. the pad id): then a short label must also predict that filler
in its unused slots, which removes the bias of the plain sum towards short labels (fewer
negative terms). The prediction is argmax_l score(l). Training loss: cross-entropy of the
gold label over these scores (`over="labels"`, i.e. softmax over the verbalizer; for
single-token labels exactly the softmax over the label tokens at the mask), or the
full-vocabulary negative log-likelihood of the gold label's tokens (`over="vocab"`).

Truncation: when the filled prompt does not fit, the longest text field is cut (see
`finetune/text_fit.py`) and counted in the `RowReport`; a prompt whose fixed text alone does not fit
is dropped and counted as `source_too_long`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, Mapping, Optional, Sequence

import torch

from megatron_biglm.config import ConfigError
from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.inference.engine import pad

from ..columns import TaskDeclarationError, as_list
from ..row_report import SOURCE_TOO_LONG, RowReport
from ..text_fit import fit_template, template_fields
from .base import LabelRecipe, accuracy_loss, gold_labels

MASK_PLACEHOLDER = "<mask>"
IGNORE_INDEX = -100


@dataclass(frozen=True)
class VerbalizerPrompt:
    """`template`: `{field}` placeholders and exactly one `<mask>` where the label word goes.
    Fields come before `<mask>` (the answer is the suffix; text after it is fixed).
    `label_words[i]` verbalises label index i. `truncatable`: fields that may be cut
    (default: every field of the template)."""
    template: str
    label_words: tuple[str, ...]
    truncatable: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.template.count(MASK_PLACEHOLDER) != 1:
            raise ValueError(f"the template needs exactly one {MASK_PLACEHOLDER}: {self.template!r}")
        if len(self.label_words) < 2 or len(set(self.label_words)) != len(self.label_words):
            raise ValueError(f"need at least two distinct label words, got {self.label_words}")
        if any(not w.strip() for w in self.label_words):
            raise ValueError(f"empty label word in {self.label_words}")
        before, after = self.template.split(MASK_PLACEHOLDER)
        if template_fields(after):
            raise ValueError(f"fields must come before {MASK_PLACEHOLDER} (the answer is the "
                             f"suffix): {self.template!r}")
        if not template_fields(before):
            raise ValueError("the template uses no {field}")

    @property
    def before(self) -> str:
        """The template before `<mask>`, without the whitespace that leads into the label."""
        return self.template.split(MASK_PLACEHOLDER)[0].rstrip()

    @property
    def label_lead(self) -> str:
        """The whitespace between the prompt and `<mask>`: it belongs to the label word."""
        head = self.template.split(MASK_PLACEHOLDER)[0]
        return head[len(head.rstrip()):]

    @property
    def after(self) -> str:
        return self.template.split(MASK_PLACEHOLDER)[1]

    @property
    def fields(self) -> tuple[str, ...]:
        return template_fields(self.before)


@dataclass
class VerbalizerExample:
    input_ids: list[int]
    split: int
    mask_positions: list[int]
    label: int | None


class VerbalizerEncoder:
    """Turns rows into `VerbalizerExample`s for one prompt, tokenizer and max length, and
    holds the label token table `slot_targets` ([L, K], IGNORE_INDEX where a label has no
    token) that `label_scores` / `verbalizer_loss` take."""

    def __init__(self, tokenizer, prompt: VerbalizerPrompt, max_length: int, *,
                 fill_short_labels_with: int | None = None):
        self.tokenizer = tokenizer
        self.prompt = prompt
        self.max_length = int(max_length)
        self.ids = TokenIds.from_tokenizer(tokenizer)
        if self.ids.bos_id is None or self.ids.eos_id is None:
            raise ValueError("the tokenizer needs BOS and EOS ids (load it with load_tokenizer)")
        self.label_token_ids = [
            list(tokenizer(prompt.label_lead + word, add_special_tokens=False)["input_ids"])
            for word in prompt.label_words]
        if any(not ids for ids in self.label_token_ids):
            raise ValueError(f"a label word tokenises to nothing: {prompt.label_words}")
        if len({tuple(ids) for ids in self.label_token_ids}) != len(self.label_token_ids):
            raise ValueError(f"two label words tokenise identically: {self.label_token_ids}")
        self.num_slots = max(len(ids) for ids in self.label_token_ids)
        fill = IGNORE_INDEX if fill_short_labels_with is None else int(fill_short_labels_with)
        self.slot_targets = torch.full((len(self.label_token_ids), self.num_slots), fill, dtype=torch.long)
        for i, ids in enumerate(self.label_token_ids):
            self.slot_targets[i, :len(ids)] = torch.tensor(ids)
        after = prompt.after
        self.after_ids = list(tokenizer(after, add_special_tokens=False)["input_ids"]) if after.strip() else []

    def encode(self, row: Mapping[str, str], label: int | None = None, *,
               report: RowReport | None = None, source="", line: int = 0) -> VerbalizerExample | None:
        budget = self.max_length - 2 - self.num_slots - len(self.after_ids)
        values = {f: row[f] for f in self.prompt.fields}
        fitted = fit_template(self.tokenizer, self.prompt.before, values, budget,
                              self.prompt.truncatable)
        if fitted is None:
            if report is not None:
                report.drop_kept(SOURCE_TOO_LONG, source, line,
                                 f"the prompt does not fit in max_length={self.max_length}")
            return None
        if report is not None:
            for field in fitted.truncated:
                report.truncate(field)
        split = 1 + len(fitted.ids)
        ids = ([self.ids.bos_id] + fitted.ids + [self.ids.mask_id] * self.num_slots
               + self.after_ids + [self.ids.eos_id])
        return VerbalizerExample(ids, split, list(range(split, split + self.num_slots)), label)


def slot_log_probs(logits: torch.Tensor, mask_positions: torch.Tensor) -> torch.Tensor:
    """[B, K, V] log-softmax over the vocabulary at each example's K mask slots. `logits` is
    [B, T, V] (the whole sequence) and `mask_positions` [B, K]."""
    index = mask_positions.long().unsqueeze(-1).expand(-1, -1, logits.size(-1))
    return torch.log_softmax(logits.gather(1, index).float(), dim=-1)


def label_scores(logits: torch.Tensor, mask_positions: torch.Tensor,
                 slot_targets: torch.Tensor) -> torch.Tensor:
    """[B, L]: score(l) = sum over label l's slots of log p(its token) (see the module doc)."""
    logp = slot_log_probs(logits, mask_positions)                      # [B, K, V]
    targets = slot_targets.to(logp.device)                             # [L, K]
    valid = targets != IGNORE_INDEX
    index = targets.clamp(min=0).t().unsqueeze(0).expand(logp.size(0), -1, -1)  # [B, K, L]
    per_slot = logp.gather(2, index).transpose(1, 2)                   # [B, L, K]
    return (per_slot * valid.unsqueeze(0)).sum(-1)


def verbalizer_loss(logits: torch.Tensor, mask_positions: torch.Tensor, slot_targets: torch.Tensor,
                    labels: torch.Tensor, over: str = "labels") -> torch.Tensor:
    """Mean loss over the batch: cross-entropy over the label scores (`over="labels"`), or
    the full-vocabulary NLL of the gold label's tokens (`over="vocab"`)."""
    scores = label_scores(logits, mask_positions, slot_targets)
    labels = labels.to(scores.device).long()
    if over == "labels":
        return torch.nn.functional.cross_entropy(scores, labels)
    if over == "vocab":
        return -scores.gather(1, labels.unsqueeze(1)).mean()
    raise ValueError(f"over must be 'labels' or 'vocab', got {over!r}")


def predict_labels(logits: torch.Tensor, mask_positions: torch.Tensor,
                   slot_targets: torch.Tensor) -> torch.Tensor:
    """[B] the label index with the highest score."""
    return label_scores(logits, mask_positions, slot_targets).argmax(-1)


def collate(examples: Sequence[VerbalizerExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch: input_ids [B, T], lengths [B], split [B], mask_positions [B, K],
    labels [B] (-1 where unlabeled)."""
    input_ids, lengths = pad([e.input_ids for e in examples], pad_id, "cpu")
    return {
        "input_ids": input_ids,
        "lengths": lengths,
        "split": torch.tensor([e.split for e in examples]),
        "mask_positions": torch.tensor([e.mask_positions for e in examples]),
        "labels": torch.tensor([-1 if e.label is None else e.label for e in examples]),
    }


@dataclass
class VerbalizerOptions:
    template: Optional[str] = None        # replaces the task's prompt (`{field}`s and one <mask>), with label_words
    label_words: Optional[list] = None    # one word per label index (strings: quote yes/no in YAML)
    loss_over: Literal["labels", "vocab"] = "labels"   # softmax over the label words, or the vocabulary
    fill_short_labels_with: Optional[int] = None       # a token id a short label predicts in its unused slots


class VerbalizerRecipe(LabelRecipe):
    """The verbalizer kind (module doc): `[BOS] prompt [MASK]*K rest [EOS]`, `split` at the first
    mask slot (0, full attention, when the run's objective has no split restriction, e.g. an
    `mlm` baseline). The loss is the cross-entropy of the gold label over the label scores
    (`finetune.options.loss_over: labels`) or the full-vocabulary NLL of its tokens (`vocab`), one term
    per example, averaged over the global batch's examples."""

    name = "verbalizer"
    metric_names = ("accuracy",)
    Options = VerbalizerOptions
    scores_zero_shot = True
    declaration_keys = ("template", "label_words", "truncatable")

    @classmethod
    def declared_schema(cls, spec, problem: str, common: dict, where: str):
        if spec.get("fields") is None and spec.get("template"):   # the fields are the template's
            spec = {**spec, "fields": list(template_fields(str(spec["template"]).split(MASK_PLACEHOLDER)[0]))}
        if spec.get("labels") is None and isinstance(spec.get("label_words"), Mapping):  # {label: word}
            spec = {**spec, "labels": list(spec["label_words"])}
        return super().declared_schema(spec, problem, common, where)

    @classmethod
    def declare(cls, spec, schema, where: str) -> tuple:
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
        words = tuple(str(w) for w in as_list(words, f"{where}.label_words"))
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
        if spec.get("dataset") is None:
            schema = dataclasses.replace(schema, text_fields=prompt.fields)
        return schema, {"fields": prompt.fields, "prompt": prompt}

    @classmethod
    def check_task(cls, task) -> None:
        if not isinstance(task.prompt, VerbalizerPrompt):
            raise ValueError(f"task {task.name}: kind 'verbalizer' needs a prompt (a VerbalizerPrompt)")

    def __init__(self, task, tokenizer, options):
        super().__init__(task, tokenizer, options)
        opts = self.opts
        if (opts.template is None) != (opts.label_words is None):
            raise ConfigError("finetune.options.template and finetune.options.label_words go together "
                              "(a prompt with one <mask>, and one word per label index)")
        if opts.label_words is not None and not all(isinstance(w, str) for w in opts.label_words):
            raise ConfigError(f"finetune.options.label_words must be strings, got {opts.label_words}: quote them "
                              "(YAML reads yes/no/true/false unquoted as booleans), e.g. ['yes', 'no']")
        if opts.template is not None:
            prompt = VerbalizerPrompt(opts.template, tuple(opts.label_words))
            self.task = dataclasses.replace(self.task, prompt=prompt, fields=prompt.fields)
        self.encoder = VerbalizerEncoder(tokenizer, self.task.prompt, options.max_length,
                                         fill_short_labels_with=opts.fill_short_labels_with)
        self.slot_targets = self.encoder.slot_targets
        self.pad_id = self.encoder.ids.pad_id

    def encode(self, rows: list[dict], report: RowReport, training: bool) -> list:  # noqa: ARG002
        return self.encode_labelled(self.encoder, rows, report)

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
                     valid_lengths=batch["valid_lengths"], runtime_gather_output=True)

    def _loss(self, batch: dict, logits: torch.Tensor):
        scores = self.scores(batch, logits)
        labels = gold_labels(batch, logits.device)
        if self.opts.loss_over == "labels":
            per_example = torch.nn.functional.cross_entropy(scores, labels, reduction="none")
        else:
            per_example = -scores.gather(1, labels.unsqueeze(1)).squeeze(1)
        return accuracy_loss(per_example.sum(), scores, labels)

    def scores(self, batch: dict, logits: torch.Tensor) -> torch.Tensor:
        return label_scores(logits, batch["mask_positions"].to(logits.device), self.slot_targets)

    @property
    def num_classes(self) -> int:
        return len(self.task.prompt.label_words)
