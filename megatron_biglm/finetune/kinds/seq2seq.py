"""The seq2seq kind (XSUM, MSQG; the paper's Table 3): CMLM training of the target given the
source, plus the length head, decoded with Mask-Predict for the task's metrics.

Layout (`Seq2SeqEncoder`, below): `[BOS] source target`, `split` = where the target starts,
so source rows never see the target, exactly as in pretraining. Training (Ghazvininejad et al., 2019):
- the target is masked uniformly: per sample the number of masked target tokens is drawn from
  1..N (N = target length; CMLM's `randint(1, N)`, i.e. beta ~ U(0, 1) with at least one mask),
  positions at random;
- `source_mask_rate` (default 0) also masks that fraction of source tokens (never BOS), a light
  noise; those tokens are predicted too;
- the loss is the masked-token cross entropy plus `length_loss_weight` x the length head's NLL
  of the target length (the model needs `model.length_head_max >= max_target_length`).
  Weight 0.1 as fairseq's CMLM port; the reference CMLM code adds it unweighted (1.0). The sum is
  divided by the masked-token count (the seam's per-token reduction), so the length term counts
  `length_loss_weight` per sample relative to one masked token.
Metrics logged with every record: `masked_accuracy` (masked tokens whose gold probability
exceeds 1/2, so gold is the argmax: a lower bound of argmax accuracy, read from the sparse
loss without logits), `length_accuracy` (the head's argmax is the target length), `length_loss`.

Validation (the fine-tune entry's `TaskValidator`): the live model decodes every source of the
split with Mask-Predict (`generation:` options; the paper's settings by default: T = 10
iterations, the length head's top-5 lengths decoded in parallel, capped at max_target_length)
through the exact prefix cache, and the task's metrics (ROUGE for XSUM; ROUGE, BLEU-4, METEOR
for MSQG) compare the texts with the untruncated references. `eval_limit` decodes only the first
that many examples of a split (XSUM's validation set has 11k; the number used is logged).

Masks are a pure function of (seed, global sample index) (`MaskedSeq2Seq` over the shared
`EpochSamples` order), so a resumed run draws the same ones. Batches are right-padded to one
width and carry `valid_lengths`.

    python -m megatron_biglm.cli.finetune --config examples/configs/finetune/xsum.yaml

Options (`finetune.options`, `Seq2SeqOptions`): max_target_length (64), max_source_length
(max_length - max_target_length), append_eos (False), length_loss_weight (0.1),
source_mask_rate (0.0), overlong_source ("truncate" | "drop"), generation ({steps: 10,
length_beam: 5}), eval_limit (all).

Features (`Seq2SeqEncoder`): `[BOS] source target [EOS]?`, with `split = len([BOS] + source)`:
source rows never see the target, exactly as in pretraining, so at decoding time the source can be encoded
once and the target slots filled by Mask-Predict. `target_length` is the number of suffix
tokens (the target, plus EOS when `append_eos`): the class the length head is trained to
predict from the prefix, and the N that Mask-Predict decodes.

Length limits: `max_source_length` bounds `[BOS] + source`, `max_target_length` the
suffix. An over-long source is cut from its end (`overlong_source="truncate"`, counted as a
`source` truncation) or the row dropped (`"drop"`, counted as `source_too_long`); an
over-long target is cut and counted as a `target` truncation. A target that tokenises to
nothing is dropped as `empty_target`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Literal, Optional, Sequence

import numpy as np
import torch

from megatron_biglm.config import derive
from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.generation import GenerationConfig, MaskPredictGenerator
from megatron_biglm.inference.engine import pad
from megatron_biglm.inference.megatron_adapter import megatron_adapter_for
from megatron_biglm.model.loss import predicted_rows
from megatron_biglm.training.recipe import LOSS_KEY, RecipeData, padding_excluded

from ..data_files import DatasetSchema, get_schema
from ..metrics import task_scores
from ..metrics.probe import text_probe
from ..row_report import EMPTY_TARGET, SOURCE_TOO_LONG, RowReport
from .base import FinetuneRecipe

# Mask-Predict as the paper decodes (Ghazvininejad et al.: T = 10, length beam 5)
DECODING_DEFAULTS = {"steps": 10, "length_beam": 5}


@dataclass
class Seq2SeqExample:
    input_ids: list[int]
    split: int
    target_length: int
    reference: str | None = None  # the target text as given (untruncated): what metrics compare with

    @property
    def length(self) -> int:
        return len(self.input_ids)


class Seq2SeqEncoder:
    def __init__(self, tokenizer, max_source_length: int, max_target_length: int, *,
                 append_eos: bool = False, overlong_source: str = "truncate"):
        if overlong_source not in ("truncate", "drop"):
            raise ValueError(f"overlong_source must be 'truncate' or 'drop', got {overlong_source!r}")
        if max_source_length < 2 or max_target_length < 1 + int(append_eos):
            raise ValueError("max_source_length must be >= 2 and max_target_length >= 1 (+1 for EOS)")
        self.tokenizer = tokenizer
        self.max_source_length = int(max_source_length)
        self.max_target_length = int(max_target_length)
        self.append_eos = append_eos
        self.overlong_source = overlong_source
        self.ids = TokenIds.from_tokenizer(tokenizer)
        if self.ids.bos_id is None or (append_eos and self.ids.eos_id is None):
            raise ValueError("the tokenizer needs a BOS id (and EOS with append_eos)")

    def prefix(self, source: str, *, report: RowReport | None = None, source_name="",
               line: int = 0) -> list[int] | None:
        """`[BOS] + source` ids within max_source_length (what decoding starts from)."""
        ids = list(self.tokenizer(source, add_special_tokens=False)["input_ids"])
        room = self.max_source_length - 1
        if len(ids) > room:
            if self.overlong_source == "drop":
                if report is not None:
                    report.drop_kept(SOURCE_TOO_LONG, source_name, line,
                                     f"{len(ids) + 1} source tokens > max_source_length={self.max_source_length}")
                return None
            ids = ids[:room]
            if report is not None:
                report.truncate("source")
        return [self.ids.bos_id] + ids

    def encode(self, source: str, target: str, *, report: RowReport | None = None,
               source_name="", line: int = 0) -> Seq2SeqExample | None:
        target_ids = list(self.tokenizer(target, add_special_tokens=False)["input_ids"])
        if not target_ids:
            if report is not None:
                report.drop_kept(EMPTY_TARGET, source_name, line, "the target tokenises to nothing")
            return None
        prefix = self.prefix(source, report=report, source_name=source_name, line=line)
        if prefix is None:
            return None
        room = self.max_target_length - int(self.append_eos)
        if len(target_ids) > room:
            target_ids = target_ids[:room]
            if report is not None:
                report.truncate("target")
        suffix = target_ids + ([self.ids.eos_id] if self.append_eos else [])
        return Seq2SeqExample(prefix + suffix, len(prefix), len(suffix), reference=target)


def collate(examples: Sequence[Seq2SeqExample], pad_id: int) -> dict[str, torch.Tensor]:
    """input_ids [B, T] right-padded, lengths [B], split [B], target_lengths [B]."""
    input_ids, lengths = pad([e.input_ids for e in examples], pad_id, "cpu")
    return {"input_ids": input_ids, "lengths": lengths,
            "split": torch.tensor([e.split for e in examples]),
            "target_lengths": torch.tensor([e.target_length for e in examples])}


@dataclass
class Seq2SeqOptions:
    max_target_length: int = 64
    max_source_length: Optional[int] = None     # default: finetune.max_length - max_target_length
    append_eos: bool = False
    length_loss_weight: float = 0.1
    source_mask_rate: float = 0.0
    overlong_source: Literal["truncate", "drop"] = "truncate"
    generation: dict = field(default_factory=dict)   # GenerationConfig fields for validation decoding
    eval_limit: Optional[int] = None                 # decode this many examples per split (None: all)


def mask_example(example: Seq2SeqExample, rng: np.random.Generator, mask_id: int,
                 source_mask_rate: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, labels, loss_mask) of one example: k ~ U{1..N} target tokens masked (CMLM), and
    each source token (not BOS) with probability `source_mask_rate`."""
    labels = np.asarray(example.input_ids, dtype=np.int64)
    split, n = example.split, example.target_length
    masked = np.zeros(len(labels), dtype=bool)
    k = int(rng.integers(1, n + 1))
    masked[split + rng.choice(n, size=k, replace=False)] = True
    if source_mask_rate > 0 and split > 1:
        masked[1:split] = rng.random(split - 1) < source_mask_rate
    tokens = np.where(masked, mask_id, labels)
    return tokens, labels, masked.astype(np.float32)


class MaskedSeq2Seq(torch.utils.data.Dataset):
    """Sample i of `ordered` (the `EpochSamples` view of the examples), masked with a
    generator seeded by (seed, i): a pure function of i, so resume is exact."""

    def __init__(self, ordered: torch.utils.data.Dataset, seed: int, mask_id: int, source_mask_rate: float):
        self.ordered, self.seed = ordered, int(seed)
        self.mask_id, self.source_mask_rate = mask_id, source_mask_rate

    def __len__(self) -> int:
        return len(self.ordered)

    def __getitem__(self, i: int) -> dict:
        example = self.ordered[int(i)]
        tokens, labels, loss_mask = mask_example(example, np.random.default_rng([self.seed, 1, int(i)]),
                                                 self.mask_id, self.source_mask_rate)
        return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "split": example.split,
                "target_length": example.target_length}


class Seq2SeqRecipe(FinetuneRecipe):
    """CMLM seq2seq fine-tuning with the length head, validated by Mask-Predict (module doc)."""

    name = "seq2seq"
    metric_names = ("masked_accuracy", "length_accuracy", "length_loss")
    Options = Seq2SeqOptions
    declaration_keys = ("source_field", "target_field")
    default_metrics = {"single_label_classification": (("rouge",), "rougeL")}

    @classmethod
    def declared_schema(cls, spec, problem: str, common: dict, where: str):  # noqa: ARG003
        """The source column (the prefix) and the target column (the suffix)."""
        extra = (str(spec["id_field"]),) if spec.get("id_field") else ()
        return DatasetSchema(text_fields=(str(spec.get("source_field", "source")),), label_field=None,
                             target_field=str(spec.get("target_field", "target")), extra_fields=extra, **common)

    def __init__(self, task, tokenizer, options):
        super().__init__(task, tokenizer, options)
        opts = self.opts
        self.max_target_length = opts.max_target_length
        self.max_source_length = (opts.max_source_length if opts.max_source_length is not None
                                  else options.max_length - self.max_target_length)
        self.length_loss_weight, self.source_mask_rate = opts.length_loss_weight, opts.source_mask_rate
        if self.length_loss_weight < 0 or not 0 <= self.source_mask_rate < 1:
            raise ValueError("finetune.options.length_loss_weight must be >= 0 and source_mask_rate in [0, 1)")
        self.encoder = Seq2SeqEncoder(tokenizer, self.max_source_length, self.max_target_length,
                                      append_eos=opts.append_eos, overlong_source=opts.overlong_source)
        self.eval_limit = opts.eval_limit
        if self.eval_limit is not None and self.eval_limit < 1:
            raise ValueError(f"finetune.options.eval_limit must be a whole number >= 1 (decode that many "
                             f"examples per split) or null (all), got {self.eval_limit!r}")
        self.decoding = self._decoding_config(opts.generation)
        ids = self.encoder.ids
        if ids.mask_id is None:
            raise ValueError("the tokenizer has no mask token; CMLM training masks target tokens")
        self.mask_id = int(ids.mask_id)
        self.pad_id = int(ids.pad_id)

    def _decoding_config(self, overrides: dict):
        if not isinstance(overrides, dict):
            raise ValueError(f"finetune.options.generation must be a mapping of Mask-Predict options "
                             f"(e.g. {{steps: 10, length_beam: 5}}), got {overrides!r}")
        values = {**DECODING_DEFAULTS, **overrides}
        if "length" not in overrides and "max_new_tokens" not in overrides:
            values["max_new_tokens"] = self.max_target_length  # caps the length head's candidates
        return GenerationConfig.from_dict(values)

    # ---- data -------------------------------------------------------------------------
    def encode(self, rows: list[dict], report: RowReport, training: bool) -> list:  # noqa: ARG002
        """One example per row: the task's first text field is the source, its target field the target."""
        schema = get_schema(self.task.dataset)
        out: list = []
        for number, row in enumerate(rows, start=1):
            example = self.encoder.encode(row[schema.text_fields[0]], row[schema.target_field],
                                          source_name=self.task.name, report=report, line=number)
            if example is not None:
                out.append(example)
        return out

    def settle(self, config):
        """The CMLM length head must cover the targets: `model.length_head_max` is raised to
        `max_target_length` when the run's model has a smaller one (none, from a pretraining start)."""
        if config.model.resolved.length_head_max >= self.max_target_length:
            return config
        return derive(config, model=config.model.with_values(length_head_max=self.max_target_length))

    def build_data(self, config, model_config, dp_size: int) -> RecipeData:
        head = getattr(model_config, "length_head_max", 0)
        if head < self.max_target_length:
            raise ValueError(f"the seq2seq recipe trains the length head: set model.length_head_max >= "
                             f"max_target_length={self.max_target_length} (it is {head})")
        if self.max_source_length + self.max_target_length > config.data.seq_length:
            raise ValueError(f"max_source_length {self.max_source_length} + max_target_length "
                             f"{self.max_target_length} exceed data.seq_length={config.data.seq_length}")
        data = super().build_data(config, model_config, dp_size)
        seed = config.data.seed
        data.train = MaskedSeq2Seq(data.train, seed, self.mask_id, self.source_mask_rate)
        return data

    def collate(self, samples: Sequence[dict]) -> dict:
        """Right-padded to max_source_length + max_target_length (one shape for every batch)."""
        width = self.max_source_length + self.max_target_length
        b = len(samples)
        tokens = torch.full((b, width), self.pad_id, dtype=torch.long)
        labels = torch.full((b, width), self.pad_id, dtype=torch.long)
        loss_mask = torch.zeros((b, width))
        for i, s in enumerate(samples):
            n = len(s["tokens"])
            tokens[i, :n] = torch.as_tensor(s["tokens"])
            labels[i, :n] = torch.as_tensor(s["labels"])
            loss_mask[i, :n] = torch.as_tensor(s["loss_mask"])
        return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask,
                "split": torch.tensor([s["split"] for s in samples]),
                "valid_lengths": torch.tensor([len(s["tokens"]) for s in samples]),
                "target_lengths": torch.tensor([s["target_length"] for s in samples])}

    # ---- forward / loss ---------------------------------------------------------------
    def forward(self, model, batch: dict, device):
        valid = batch["valid_lengths"]  # on the host: the model checks it there without a sync
        host_mask = padding_excluded(batch["loss_mask"], valid)
        loss_mask = host_mask.to(device)
        labels = batch["labels"].to(device)
        output = model(batch["tokens"].to(device), split=batch["split"], valid_lengths=valid,
                       labels=labels, loss_mask=loss_mask, predicted_rows=predicted_rows(host_mask),
                       length_prefix=batch["split"].to(device))
        return output, partial(self._loss, loss_mask, batch["target_lengths"].to(device), labels,
                               batch["tokens"].to(device))

    def _loss(self, loss_mask, target_lengths, labels, tokens, output):
        token_loss, length_logits = output
        mask = loss_mask.float()
        mlm_sum = (token_loss.float() * mask).sum()
        n_tokens = (mask != 0).sum()
        length_nll = torch.nn.functional.cross_entropy(length_logits.float(), target_lengths, reduction="sum")
        loss_sum = mlm_sum + self.length_loss_weight * length_nll
        samples = torch.tensor(float(target_lengths.numel()), device=mask.device)
        # p(gold) > 1/2 (cross entropy < log 2) makes gold the argmax: counted without logits
        correct_tokens = ((token_loss.float() < 0.6931471805599453) & (mask != 0)).sum().float()
        length_correct = (length_logits.argmax(-1) == target_lengths).sum().float()
        report = {LOSS_KEY: torch.stack([loss_sum.detach(), n_tokens.float()]),
                  "masked_accuracy": torch.stack([correct_tokens.detach(), n_tokens.float()]),
                  "length_accuracy": torch.stack([length_correct, samples]),
                  "length_loss": torch.stack([length_nll.detach(), samples])}
        return loss_sum, n_tokens.to(torch.int), report

    def loss_tokens(self, batch: dict) -> int:
        return int((padding_excluded(batch["loss_mask"], batch.get("valid_lengths")) != 0).sum())

    def attention_splits(self, batch: dict) -> list | None:
        return batch["split"].tolist()

    # ---- validation -------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, adapter, examples: Sequence[Seq2SeqExample]) -> list[str]:
        """Mask-Predict outputs (text) for the examples' sources."""
        generator = MaskPredictGenerator(adapter, self.tokenizer)
        sources = [e.input_ids[1:e.split] for e in examples]  # the generator adds BOS
        outputs = generator.generate_ids(sources, self.decoding, batch_size=self.options.eval_batch_size)
        return [o.text.strip() for o in outputs]

    @torch.no_grad()
    def length_accuracy(self, adapter, examples: Sequence[Seq2SeqExample]) -> float:
        """How often the length head's top length is the target length."""
        hits, size = 0, self.options.eval_batch_size
        for start in range(0, len(examples), size):
            chunk = examples[start:start + size]
            ids, lengths = pad([e.input_ids[:e.split] for e in chunk], self.pad_id, adapter.device)
            top = adapter.predict_lengths(ids, lengths, 1).lengths[:, 0].cpu()
            hits += int((top == torch.tensor([e.target_length for e in chunk])).sum())
        return hits / len(examples)

    def evaluate_split(self, model, name: str, examples: list, device) -> dict[str, float]:  # noqa: ARG002
        """The task's metrics on Mask-Predict outputs, plus exact match and the length head's accuracy."""
        if self.eval_limit is not None and len(examples) > int(self.eval_limit):
            print(f"[seq2seq] {name}: decoding the first {int(self.eval_limit)} of {len(examples)} "
                  f"examples (finetune.options.eval_limit)", flush=True)
            examples = examples[:int(self.eval_limit)]
        if not examples:
            raise ValueError(f"split {name} has no examples left to decode; see its row report (finetune: "
                             f"{name}: ...) for why every row was dropped")
        references = [e.reference for e in examples]
        if any(r is None for r in references):
            raise ValueError(f"split {name}: examples without reference text cannot be scored; encode them "
                             f"with Seq2SeqEncoder.encode (it keeps the target text)")
        adapter = megatron_adapter_for(model, self.tokenizer)
        predictions = self.decode(adapter, examples)
        scores = task_scores(self.task.metrics, predictions, references)
        scores["exact_match"] = float(np.mean([p == r.strip() for p, r in zip(predictions, references)]))
        scores["length_accuracy"] = self.length_accuracy(adapter, examples)
        return scores

    def metric_probe(self):
        return text_probe()
