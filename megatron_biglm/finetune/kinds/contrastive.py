"""The contrastive kind: fine-tuning retrieval embeddings, a Recipe on the one training loop.
The pretrained model already embeds, so this kind scores zero-shot.

Data: jsonl pairs (`finetune/retrieval/pairs.py`), drawn epoch by epoch in the one epoch
order of every recipe (`finetune/epochs.py`), so the sample is a pure function of its global
index and `consumed_samples` resumes it. A micro-batch holds the
queries (prefixed "query: ") and their passages (prefixed "passage: "): b positives, then
b*k hard negatives. One forward encodes both (right-padded to one length, padding masked by
`valid_lengths`); the loss is InfoNCE over in-batch + hard negatives gathered from every DP
rank with gradients (`info_nce_sum`, below). The loss is summed over the
micro-batch's queries and the loop divides by the global query count, so a DP=2 run with
micro-batch b equals a DP=1 run with micro-batch 2b.

Checkpoints, resume, logs and validation come from the loop; the model is BiGLMModel with
its masked-LM head unused, so every exporter (to-hf, to-st) takes the result as is.

Through the fine-tuning entry (`finetune.task: {kind: contrastive}`): `finetune.data.train` is
the pairs file(s), each evaluation split a BEIR folder (corpus.jsonl, queries.jsonl,
qrels/<options.split>.tsv) scored at every validation by nDCG@10 / Recall@100 / MRR@10 of exact
search over the corpus (the select metric: nDCG@10), as `eval_retrieval` scores it. The epochs
count pairs. `finetune.max_length` caps each text's tokens. Options (`ContrastiveOptions`):
hard_negatives (k, 0), temperature (0.05), pooling (mean|first|cls|last), normalize (true),
query_prefix ("query: "), passage_prefix ("passage: "), split ("test").

InfoNCE (`info_nce_sum`), with in-batch negatives, optional hard negatives, and negatives from
every DP rank: query i's positive is passage i; every other passage of the batch (other queries' positives
and everyone's hard negatives) is a negative. Under data parallelism the passage embeddings
of all DP ranks are gathered WITH gradients (`torch.distributed.nn.functional.all_gather`,
whose backward sums the gradients that reach each rank's slice), so each rank's queries are
scored against the global batch: the loss and the gradients are those of one process
holding the whole global micro-batch. Each rank returns the loss summed over ITS queries;
the loop divides by the global query count.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from torch.distributed.nn.functional import all_gather

from megatron_biglm.checkpoint.task_head import DEFAULT_PROMPTS, EmbedderRecord
from megatron_biglm.config import ConfigError
from megatron_biglm.data.tokenizer import load_tokenizer
from megatron_biglm.training.recipe import LOSS_KEY, RecipeData

from ..epochs import EpochSamples
from ..retrieval.beir import METRICS, BeirFormatError, evaluate_beir, load_beir
from ..retrieval.embed import EmbeddingOptions, pool, tokenize
from ..retrieval.encoders import OurEncoder
from ..retrieval.pairs import read_pairs
from ..row_report import EMPTY_FIELD, RowReport
from .base import FinetuneRecipe


@dataclass
class ContrastiveOptions:
    hard_negatives: int = 0
    temperature: float = 0.05
    pooling: Literal["mean", "first", "cls", "last"] = EmbedderRecord.pooling
    normalize: bool = EmbedderRecord.normalize
    query_prefix: str = DEFAULT_PROMPTS["query"]
    passage_prefix: str = DEFAULT_PROMPTS["passage"]
    split: str = "test"   # qrels/<split>.tsv of the validation folders
    keep_first_duplicate: bool = False   # a BEIR _id given twice: keep the first row (counted), not an error


def gather_with_grad(x: torch.Tensor, group=None) -> tuple[torch.Tensor, int]:
    """(concatenation over the group's ranks, in rank order, of x [n, h]; this rank's offset).
    Every rank must hold the same n. Without a group of more than one rank: (x, 0)."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return x, 0

    parts = all_gather(x.contiguous(), group=group)
    return torch.cat(parts, dim=0), dist.get_rank(group) * x.shape[0]


def info_nce_sum(queries: torch.Tensor, passages: torch.Tensor, *, temperature: float,
                 group=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss summed over this rank's queries, correct top-1 count).

    queries [b, h]; passages [b * (1 + k), h] laid out as b positives then b*k hard negatives
    (any order after the positives). With a DP group, the positives of all ranks come first
    in the gathered matrix, then all ranks' hard negatives, so query j of rank r has label
    r*b + j."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    b = queries.shape[0]
    positives, negatives = passages[:b], passages[b:]
    all_pos, offset = gather_with_grad(positives, group)
    columns = all_pos
    if negatives.shape[0]:
        all_neg, _ = gather_with_grad(negatives, group)
        columns = torch.cat([all_pos, all_neg])
    logits = queries.float() @ columns.float().T / temperature
    labels = torch.arange(offset, offset + b, device=logits.device)
    loss = torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
    correct = (logits.argmax(dim=1) == labels).sum()
    return loss, correct


def collate_pairs(samples, *, tokenizer, options: EmbeddingOptions) -> dict:
    """Pairs -> {tokens, valid_lengths (queries), passages, passage_lengths}: b positives then
    the hard negatives, every text prefixed with its side's prompt, each side padded to its own
    longest row."""
    queries = [options.prompts["query"] + s.query for s in samples]
    passages = [options.prompts["passage"] + s.positive for s in samples]
    passages += [options.prompts["passage"] + n for s in samples for n in s.negatives]
    q_ids, q_len = tokenize(tokenizer, queries, options.max_length)
    p_ids, p_len = tokenize(tokenizer, passages, options.max_length)
    return {"tokens": q_ids, "valid_lengths": q_len, "passages": p_ids, "passage_lengths": p_len,
            "pad_id": tokenizer.pad_token_id}


def _folder_report(folder, data) -> RowReport:
    """A BEIR folder's queries as rows (those with empty text dropped, with their lines) and its
    documents with empty text, also dropped: what validation leaves out, counted."""

    report = RowReport.all_kept(len(data.queries) + len(data.empty_query_lines))
    for line in data.empty_query_lines:
        report.drop_kept(EMPTY_FIELD, Path(folder) / "queries.jsonl", line, "query text")
    if data.skipped_documents:
        report.rows_seen += data.skipped_documents
        report.skip("empty_document", Path(folder) / "corpus.jsonl", 0,
                    f"{data.skipped_documents} document(s) with empty text", count=data.skipped_documents)
    return report


class ContrastiveRecipe(FinetuneRecipe):
    """InfoNCE retrieval fine-tuning (see the module docstring)."""

    name = "contrastive"
    metric_names = ("in_batch_accuracy",)
    Options = ContrastiveOptions
    scores_zero_shot = True
    default_metrics = {"single_label_classification": (("retrieval",), "ndcg@10")}
    reads_columns = False   # the pairs and the BEIR folders have their own formats

    def __init__(self, task, tokenizer, options):
        super().__init__(task, tokenizer, options)
        if self.opts.temperature <= 0 or self.opts.hard_negatives < 0:
            raise ValueError(f"finetune.options.temperature must be > 0 and hard_negatives >= 0, got "
                             f"{self.opts.temperature}, {self.opts.hard_negatives}")
        self.embedding = EmbeddingOptions(pooling=self.opts.pooling, normalize=self.opts.normalize,
                                          prompts={"query": self.opts.query_prefix,
                                                   "passage": self.opts.passage_prefix},
                                          max_length=options.max_length)

    def task_head(self) -> EmbedderRecord:
        e = self.embedding
        return EmbedderRecord(pooling=e.pooling, normalize=e.normalize, prompts=dict(e.prompts), max_length=e.max_length)

    # ---- data -------------------------------------------------------------------------
    def prepare(self, config) -> None:
        """The training pairs (dropped rows counted) and every evaluation folder, checked."""
        self.use_split = False
        files = self.options.data.get(self.task.train_split)
        if self.options.train_examples != 0:  # 0: score the start point only
            if not files:
                raise ConfigError(f"finetune.data.{self.task.train_split}: the contrastive kind trains on pairs: "
                                  'jsonl rows {"query": ..., "positive": ..., "negatives": [...]}')
            self.train_examples, report = read_pairs(files, hard_negatives=self.opts.hard_negatives)
            self.reports[self.task.train_split] = report
            self._refuse_empty(self.task.train_split, self.train_examples, report)
        names = self.eval_split_names() + ([self.options.test_split] if self.options.test_split else [])
        for name in names:
            folder = self.options.data.get(name)
            if not folder or isinstance(folder, list):
                raise ConfigError(f"finetune.data.{name}: a BEIR folder (corpus.jsonl, queries.jsonl, "
                                  f"qrels/{self.opts.split}.tsv) to score retrieval on")
            try:
                data = load_beir(folder, self.opts.split, duplicate_ids=self._duplicate_ids,
                                 keep_first_option="finetune.options.keep_first_duplicate=true",
                                 skip_unknown_option=None)
            except BeirFormatError as exc:
                raise ConfigError(f"finetune.data.{name}: {exc}") from None
            self.eval_examples[name] = [str(folder)]
            self.reports[name] = _folder_report(folder, data)

    def build_data(self, config, model_config, dp_size: int) -> RecipeData:  # noqa: ARG002
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(config.data.tokenizer)
        if not self.train_examples:
            self.prepare(config)
        gbs = config.training.global_batch_size
        collate = partial(collate_pairs, tokenizer=self.tokenizer, options=self.embedding)
        # no validation loss: retrieval is validated by its metrics (evaluate_split)
        return RecipeData(train=EpochSamples(self.train_examples, gbs, config.schedule.train_steps * gbs,
                                             config.data.seed),
                          valid=None, tokenizer=self.tokenizer, collate_fn=collate)

    # ---- loss -------------------------------------------------------------------------
    def forward(self, model, batch, device):
        """Queries and passages in two forwards, each at its own padded width."""
        # the lengths stay on the host: the model and the pooling check them there, no sync
        q_len, p_len = batch["valid_lengths"], batch["passage_lengths"]
        queries = model(batch["tokens"].to(device), split=None, valid_lengths=q_len, return_hidden=True)
        passages = model(batch["passages"].to(device), split=None, valid_lengths=p_len, return_hidden=True)
        return (queries, passages), partial(self._loss, q_len, p_len)

    def _loss(self, q_len, p_len, hidden):
        queries, passages = (pool(h, n, self.embedding) for h, n in zip(hidden, (q_len, p_len)))
        group = parallel_state.get_data_parallel_group() if parallel_state.model_parallel_is_initialized() else None
        loss, correct = info_nce_sum(queries, passages, temperature=self.opts.temperature, group=group)
        count = torch.tensor(queries.shape[0], dtype=torch.int, device=loss.device)
        report = {LOSS_KEY: torch.stack([loss.detach(), count.float()]),
                  "in_batch_accuracy": torch.stack([correct.float(), count.float()])}
        return loss, count, report

    def loss_tokens(self, batch):
        return int(batch["tokens"].shape[0])

    @property
    def _duplicate_ids(self) -> str:
        return "keep_first" if self.opts.keep_first_duplicate else "error"

    # ---- validation -------------------------------------------------------------------
    @torch.no_grad()
    def evaluate_split(self, model, name: str, examples: list, device) -> dict[str, float]:  # noqa: ARG002

        scores = evaluate_beir(OurEncoder(model, self.tokenizer, self.embedding), examples[0],
                               split=self.opts.split, progress=False, duplicate_ids=self._duplicate_ids)
        return {m: scores[m] for m in METRICS}

