"""Seq2seq fine-tuning (XSUM, MSQG; the paper's Table 3): CMLM training of the target given the
source, plus the length head, decoded with Mask-Predict.

Layout (`tasks/seq2seq.py`): `[BOS] source target`, `split` = where the target starts, so source
rows never see the target, exactly as in pretraining. Training (Ghazvininejad et al., 2019):
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

Masks are a pure function of (seed, global sample index) (`MaskedSeq2Seq`), so a resumed run
draws the same ones. Batches are right-padded to one width and carry `valid_lengths`.

    recipe = Seq2SeqRecipe(task, tokenizer, options)    # options: mapping or finetune section
    recipe.set_examples(train_examples, valid_examples)  # or read from options["data"]
    train(config, recipe=recipe)

Options (`options.get(key, default)`): max_length (source budget incl. BOS, 256),
max_target_length (64), append_eos (False), length_loss_weight (0.1), source_mask_rate (0.0),
data ({split: files}).
"""
from __future__ import annotations

from functools import partial
from typing import Sequence

import numpy as np
import torch

from megatron_biglm.training.recipe import LOSS_KEY, Recipe, RecipeData, padding_excluded

from ..tasks.seq2seq import Seq2SeqEncoder, Seq2SeqExample

DEFAULTS = {"max_length": 256, "max_target_length": 64, "append_eos": False,
            "length_loss_weight": 0.1, "source_mask_rate": 0.0}


def _option(options, key):
    if options is None:
        return DEFAULTS[key]
    value = options.get(key, None)
    return DEFAULTS[key] if value is None else value


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
    """Global sample i -> example of epoch i // len(examples) (a fresh permutation per epoch),
    masked with a generator seeded by (seed, i): a pure function of i, so resume is exact."""

    def __init__(self, examples: Sequence[Seq2SeqExample], total: int, seed: int, mask_id: int,
                 source_mask_rate: float, shuffle: bool = True):
        if not examples:
            raise ValueError("no seq2seq examples to train on (every row was dropped; see the row report)")
        self.examples, self.total, self.seed = list(examples), int(total), int(seed)
        self.mask_id, self.source_mask_rate, self.shuffle = mask_id, source_mask_rate, shuffle

    def __len__(self) -> int:
        return self.total

    def __getitem__(self, i: int) -> dict:
        epoch, within = divmod(int(i), len(self.examples))
        order = (np.random.default_rng([self.seed, epoch]).permutation(len(self.examples))
                 if self.shuffle else np.arange(len(self.examples)))
        example = self.examples[int(order[within])]
        tokens, labels, loss_mask = mask_example(example, np.random.default_rng([self.seed, 1, int(i)]),
                                                 self.mask_id, self.source_mask_rate)
        return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "split": example.split,
                "target_length": example.target_length}


class Seq2SeqRecipe(Recipe):
    """CMLM seq2seq fine-tuning with the length head (see the module doc)."""

    name = "seq2seq"
    metric_names = ("masked_accuracy", "length_accuracy", "length_loss")

    def __init__(self, task, tokenizer, options=None):
        self.task, self.tokenizer, self.options = task, tokenizer, options
        self.max_source_length = int(_option(options, "max_length"))
        self.max_target_length = int(_option(options, "max_target_length"))
        self.length_loss_weight = float(_option(options, "length_loss_weight"))
        self.source_mask_rate = float(_option(options, "source_mask_rate"))
        if self.length_loss_weight < 0 or not 0 <= self.source_mask_rate < 1:
            raise ValueError("length_loss_weight must be >= 0 and source_mask_rate in [0, 1)")
        self.encoder = Seq2SeqEncoder(tokenizer, self.max_source_length, self.max_target_length,
                                      append_eos=bool(_option(options, "append_eos")))
        ids = self.encoder.ids
        if ids.mask_id is None:
            raise ValueError("the tokenizer has no mask token; CMLM training masks target tokens")
        self.mask_id = int(ids.mask_id)
        self.pad_id = int(next(i for i in (ids.pad_id, ids.eos_id, ids.mask_id) if i is not None))
        self.train_examples: list[Seq2SeqExample] = []
        self.eval_examples: dict[str, list[Seq2SeqExample]] = {}

    # ---- data -------------------------------------------------------------------------
    def set_examples(self, train: Sequence[Seq2SeqExample], valid: Sequence[Seq2SeqExample] | None = None):
        self.train_examples = list(train)
        if valid:
            self.eval_examples["validation"] = list(valid)

    def _read(self, split: str) -> list[Seq2SeqExample]:
        from ..data_files import load_split
        from ..tasks import encode_rows

        files = (self.options.get("data", None) or {}).get(split) if self.options is not None else None
        if not files:
            raise ValueError(f"seq2seq task {getattr(self.task, 'name', '?')}: no examples for split "
                             f"{split!r}; set finetune.data.{split}=FILES or call set_examples()")
        rows, report = load_split(self.task.dataset, files=files)
        examples = encode_rows(self.task, rows, self.tokenizer, max_length=self.max_source_length,
                               report=report, max_target_length=self.max_target_length,
                               append_eos=self.encoder.append_eos)
        print(f"[seq2seq] {split}: {report.summary_line()}", flush=True)
        return examples

    def build_data(self, config, model_config, dp_size: int) -> RecipeData:  # noqa: ARG002
        head = getattr(model_config, "length_head_max", 0)
        if head < self.max_target_length:
            raise ValueError(f"the seq2seq recipe trains the length head: set model.length_head_max >= "
                             f"max_target_length={self.max_target_length} (it is {head})")
        if self.max_source_length + self.max_target_length > config.data.seq_length:
            raise ValueError(f"max_length {self.max_source_length} + max_target_length "
                             f"{self.max_target_length} exceed data.seq_length={config.data.seq_length}")
        if not self.train_examples:
            self.train_examples = self._read(getattr(self.task, "train_split", "train"))
        if not self.eval_examples and self.options is not None and (self.options.get("data", None) or {}):
            name = getattr(self.task, "eval_splits", ("validation",))[0]
            if name in self.options.get("data"):
                self.eval_examples[name] = self._read(name)
        gbs = config.training.global_batch_size
        seed = config.data.seed
        train = MaskedSeq2Seq(self.train_examples, config.schedule.train_steps * gbs, seed,
                              self.mask_id, self.source_mask_rate)
        valid_examples = next(iter(self.eval_examples.values()), None)
        valid = None
        if valid_examples:
            n = -(-len(valid_examples) // gbs) * gbs
            valid = MaskedSeq2Seq(valid_examples, n, seed + 1, self.mask_id, 0.0, shuffle=False)
        return RecipeData(train=train, valid=valid, tokenizer=self.tokenizer, collate_fn=self.collate)

    def collate(self, samples: Sequence[dict]) -> dict:
        """Right-padded to max_length + max_target_length (one shape for every batch)."""
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
        valid = batch["valid_lengths"].to(device)
        loss_mask = padding_excluded(batch["loss_mask"].to(device), valid)
        labels = batch["labels"].to(device)
        output = model(batch["tokens"].to(device), split=batch["split"], valid_lengths=valid,
                       labels=labels, loss_mask=loss_mask, length_prefix=batch["split"].to(device))
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
