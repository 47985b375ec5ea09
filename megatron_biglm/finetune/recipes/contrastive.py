"""Contrastive fine-tuning of retrieval embeddings: a Recipe on the one training loop.

Data: jsonl pairs (`finetune/retrieval/pairs.py`), drawn epoch by epoch in the one epoch
order of every recipe (`finetune/epochs.py`), so the sample is a pure function of its global
index and `consumed_samples` resumes it. A micro-batch holds the
queries (prefixed "query: ") and their passages (prefixed "passage: "): b positives, then
b*k hard negatives. One forward encodes both (right-padded to one length, padding masked by
`valid_lengths`); the loss is InfoNCE over in-batch + hard negatives gathered from every DP
rank with gradients (`finetune/retrieval/infonce.py`). The loss is summed over the
micro-batch's queries and the loop divides by the global query count, so a DP=2 run with
micro-batch b equals a DP=1 run with micro-batch 2b.

Checkpoints, resume, logs and validation come from the loop; the model is BiGLMModel with
its masked-LM head unused, so every exporter (to-hf, to-st) takes the result as is.

Options (a dict): train (jsonl path or list, required), valid (jsonl, optional),
hard_negatives (k, default 0), temperature (0.05), pooling (mean|first|cls|last),
normalize (True), max_length (default data.seq_length), query_prefix, passage_prefix.
"""
from __future__ import annotations

from functools import partial

import torch

from megatron_biglm.finetune.epochs import EpochSamples
from megatron_biglm.finetune.retrieval.embed import EmbeddingOptions, pool, tokenize
from megatron_biglm.finetune.retrieval.infonce import info_nce_sum
from megatron_biglm.finetune.retrieval.pairs import read_pairs
from megatron_biglm.training.recipe import LOSS_KEY, Recipe, RecipeData

KNOWN_OPTIONS = {"train", "valid", "hard_negatives", "temperature", "pooling", "normalize", "max_length",
                 "query_prefix", "passage_prefix"}


def collate_pairs(samples, *, tokenizer, options: EmbeddingOptions) -> dict:
    """Pairs -> {tokens, valid_lengths (queries), passages, passage_lengths}: b positives then
    the hard negatives, every text prefixed with its side's prompt."""
    queries = [options.prompts["query"] + s.query for s in samples]
    passages = [options.prompts["passage"] + s.positive for s in samples]
    passages += [options.prompts["passage"] + n for s in samples for n in s.negatives]
    q_ids, q_len = tokenize(tokenizer, queries, options.max_length)
    p_ids, p_len = tokenize(tokenizer, passages, options.max_length)
    return {"tokens": q_ids, "valid_lengths": q_len, "passages": p_ids, "passage_lengths": p_len,
            "pad_id": tokenizer.pad_token_id}


def _pad_to(ids: torch.Tensor, length: int, pad_id: int) -> torch.Tensor:
    return torch.nn.functional.pad(ids, (0, length - ids.shape[1]), value=pad_id)


class ContrastiveRecipe(Recipe):
    """InfoNCE retrieval fine-tuning (see the module docstring)."""

    name = "contrastive"
    metric_names = ("in_batch_accuracy",)

    def __init__(self, task=None, tokenizer=None, options: dict | None = None):
        options = dict(options or {})
        unknown = set(options) - KNOWN_OPTIONS
        if unknown:
            raise ValueError(f"unknown contrastive options {sorted(unknown)}; known: {sorted(KNOWN_OPTIONS)}")
        if "train" not in options:
            raise ValueError("the contrastive recipe needs options['train']: a jsonl of "
                             '{"query", "positive", "negatives"?} rows')
        self.task, self.tokenizer, self.options = task, tokenizer, options
        self.hard_negatives = int(options.get("hard_negatives", 0))
        self.temperature = float(options.get("temperature", 0.05))
        if self.temperature <= 0 or self.hard_negatives < 0:
            raise ValueError(f"temperature must be > 0 and hard_negatives >= 0, got "
                             f"{self.temperature}, {self.hard_negatives}")
        self.embedding = None  # EmbeddingOptions, once the sequence length is known
        self.reports: dict = {}

    def embedding_options(self, max_length: int) -> EmbeddingOptions:
        prompts = {"query": self.options.get("query_prefix", "query: "),
                   "passage": self.options.get("passage_prefix", "passage: ")}
        return EmbeddingOptions(pooling=self.options.get("pooling", "mean"),
                                normalize=bool(self.options.get("normalize", True)), prompts=prompts,
                                max_length=int(self.options.get("max_length", max_length)))

    def build_data(self, config, model_config, dp_size):  # noqa: ARG002
        import logging

        if self.tokenizer is None:
            from megatron_biglm.data.tokenizer import load_tokenizer

            self.tokenizer = load_tokenizer(config.data.tokenizer)
        self.embedding = self.embedding_options(config.data.seq_length)
        gbs = config.training.global_batch_size
        train, report = read_pairs(self.options["train"], hard_negatives=self.hard_negatives)
        self.reports["train"] = report.as_dict()
        logging.getLogger(__name__).info("contrastive train pairs: %s", report.summary_line())
        valid = None
        if self.options.get("valid") and config.training.eval_iters > 0:
            pairs, vreport = read_pairs(self.options["valid"], hard_negatives=self.hard_negatives)
            self.reports["valid"] = vreport.as_dict()
            valid = EpochSamples(pairs, gbs, config.training.eval_iters * gbs, config.data.seed + 1)
        collate = partial(collate_pairs, tokenizer=self.tokenizer, options=self.embedding)
        return RecipeData(train=EpochSamples(train, gbs, config.schedule.train_steps * gbs, config.data.seed),
                          valid=valid, tokenizer=self.tokenizer, collate_fn=collate)

    def forward(self, model, batch, device):
        q, p = batch["tokens"], batch["passages"]
        length = max(q.shape[1], p.shape[1])
        tokens = torch.cat([_pad_to(q, length, batch["pad_id"]), _pad_to(p, length, batch["pad_id"])])
        lengths = torch.cat([batch["valid_lengths"], batch["passage_lengths"]]).to(device)
        hidden = model(tokens.to(device), split=None, valid_lengths=lengths, return_hidden=True)
        return hidden, partial(self._loss, lengths, q.shape[0])

    def _loss(self, lengths, n_queries, hidden):
        from megatron.core import parallel_state

        vectors = pool(hidden, lengths, self.embedding)
        group = parallel_state.get_data_parallel_group() if parallel_state.model_parallel_is_initialized() else None
        loss, correct = info_nce_sum(vectors[:n_queries], vectors[n_queries:], temperature=self.temperature,
                                     group=group)
        count = torch.tensor(n_queries, dtype=torch.int, device=loss.device)
        report = {LOSS_KEY: torch.stack([loss.detach(), count.float()]),
                  "in_batch_accuracy": torch.stack([correct.float(), count.float()])}
        return loss, count, report

    def loss_tokens(self, batch):
        return int(batch["tokens"].shape[0])
