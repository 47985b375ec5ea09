"""The span kind, extractive QA (SQuAD v1.1): a start/end span head over question + context windows.

A question's context is cut into windows `[BOS] question [EOS] context-window [EOS]` with a
doc stride (`finetune/squad_windows.py`; `finetune.options.doc_stride`, `max_query_length`),
right-padded to `finetune.max_length`; `split` is 0. The model is `BiGLMHeadModel` with the
`span` head (start and end logits per position). Loss: per window, the mean of the start and
end cross-entropies, each a softmax over that window's context positions plus position 0
(BOS), the target of a window that does not hold the answer (BERT's convention); question,
separators and padding can never be picked. One term per window, averaged over the global
batch's windows. Prediction: the n-best start/end pairs of all windows of a question, spans
at most `max_answer_length` tokens (`finetune.options.n_best` 20, `max_answer_length` 30;
`finetune/squad_answers.py`), scored with the official EM/F1 (`metrics.squad`).

The loop's validation loss uses the selection split encoded with its gold answers; the task
metric is computed from windows encoded without them. Exports as
EuroBertForTokenClassification with 2 labels (start, end) (`export.head_export`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from megatron_biglm.checkpoint.task_head import HeadRecord
from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.model.head_model import head_model_provider, head_of_record
from megatron_biglm.training.recipe import LOSS_KEY

from ..data_files import DatasetSchema
from ..metrics import task_scores
from ..metrics.probe import answer_probe
from ..row_report import RowReport
from ..squad_answers import squad_predictions
from ..squad_windows import SquadEncoder
from .base import FinetuneRecipe

#: a declaration's column keys -> the SQuAD role each names (and its default column)
COLUMN_KEYS = {"context_field": "context", "question_field": "question", "answers_field": "answers"}


@dataclass
class SpanOptions:
    doc_stride: int = 128         # tokens of context shared by consecutive windows
    max_query_length: int = 64    # question tokens kept
    n_best: int = 20              # start/end candidates per window
    max_answer_length: int = 30   # tokens of the longest answer considered


class SpanQARecipe(FinetuneRecipe):
    name = "span_qa"
    metric_names = ("start_accuracy", "end_accuracy")
    Options = SpanOptions
    declaration_keys = tuple(COLUMN_KEYS)
    default_metrics = {"single_label_classification": (("squad",), "f1")}

    @classmethod
    def declared_schema(cls, spec, problem: str, common: dict, where: str):  # noqa: ARG003
        """SQuAD's columns, under the names the declaration gives them."""
        extra = (str(spec["id_field"]),) if spec.get("id_field") else ()
        return DatasetSchema(text_fields=(str(spec.get("context_field", "context")),
                                          str(spec.get("question_field", "question"))), label_field=None,
                             answers_field=str(spec.get("answers_field", "answers")),
                             extra_fields=extra or ("id",), **common)

    @classmethod
    def declare(cls, spec, schema, where: str) -> tuple:
        """The text fields, and which column holds each SQuAD role (`encode` reads them)."""
        schema, fields = super().declare(spec, schema, where)
        columns = {role: str(spec.get(key, role)) for key, role in COLUMN_KEYS.items()}
        return schema, {**fields, "columns": {**columns, "id": str(spec.get("id_field", "id"))}}

    def __init__(self, task, tokenizer, options):
        super().__init__(task, tokenizer, options)
        self.doc_stride, self.max_query_length = self.opts.doc_stride, self.opts.max_query_length
        self.n_best, self.max_answer_length = self.opts.n_best, self.opts.max_answer_length
        self.pad_id = TokenIds.from_tokenizer(tokenizer).pad_id

    def task_head(self) -> HeadRecord:
        return HeadRecord("span", 2, id2label=("start", "end"))

    def encode(self, rows: list[dict], report: RowReport, training: bool) -> list:
        """Every row's windows (with their gold positions when `training`); a declared task's own
        column names are read as SQuAD's."""
        encoder = SquadEncoder(self.tokenizer, max_length=self.options.max_length, doc_stride=self.doc_stride,
                               max_query_length=self.max_query_length)
        columns = self.task.columns
        out: list = []
        for number, row in enumerate(rows, start=1):
            if columns:
                row = {role: row[column] for role, column in columns.items() if column in row}
            out.extend(encoder.encode(row, training=training, source=self.task.name, report=report, line=number))
        return out

    def model_provider(self, pre_process, post_process, config, transformer_config):
        return head_model_provider(*head_of_record(self.task_head()))(
            pre_process, post_process, config, transformer_config)

    def collate(self, windows: Sequence) -> dict:
        width = self.options.max_length
        b = len(windows)
        tokens = torch.full((b, width), self.pad_id, dtype=torch.long)
        allowed = torch.zeros((b, width), dtype=torch.bool)
        allowed[:, 0] = True
        for i, w in enumerate(windows):
            tokens[i, :w.length] = torch.tensor(w.input_ids)
            allowed[i, :w.length] |= torch.tensor([o is not None for o in w.offsets])
        return {"tokens": tokens, "valid_lengths": torch.tensor([w.length for w in windows]),
                "allowed": allowed,
                "start_positions": torch.tensor([w.start_position for w in windows]),
                "end_positions": torch.tensor([w.end_position for w in windows])}

    def _loss(self, batch: dict, logits: torch.Tensor):
        allowed = batch["allowed"].to(logits.device)
        masked = logits.float().masked_fill(~allowed[..., None], float("-inf"))  # [b, s, 2]
        starts, ends = batch["start_positions"].to(logits.device), batch["end_positions"].to(logits.device)
        ce = torch.nn.functional.cross_entropy
        loss_sum = 0.5 * (ce(masked[..., 0], starts, reduction="sum") + ce(masked[..., 1], ends, reduction="sum"))
        n = starts.numel()
        count = torch.tensor(n, dtype=torch.int, device=logits.device)
        start_ok = (masked[..., 0].argmax(-1) == starts).sum().float().detach()
        end_ok = (masked[..., 1].argmax(-1) == ends).sum().float().detach()
        return loss_sum, count, {LOSS_KEY: torch.stack([loss_sum.detach(), count.float()]),
                                 "start_accuracy": torch.stack([start_ok, count.float()]),
                                 "end_accuracy": torch.stack([end_ok, count.float()])}

    def loss_tokens(self, batch: dict) -> int:
        return int(batch["start_positions"].numel())

    @torch.no_grad()
    def span_logits(self, model, windows: Sequence, device, batch_size: int) -> tuple[list, list]:
        starts, ends = [], []
        for first in range(0, len(windows), batch_size):
            logits = self.logits(model, self.collate(windows[first:first + batch_size]), device).float().cpu()
            starts.extend(logits[..., 0])
            ends.extend(logits[..., 1])
        return starts, ends

    def predict(self, model, rows: list[dict], windows: Sequence, device, batch_size: int) -> dict[str, str]:
        """example id -> answer text (n-best over the question's windows)."""
        starts, ends = self.span_logits(model, windows, device, batch_size)
        contexts = {_row_id(r, i): r["context"] for i, r in enumerate(rows, start=1)}
        return squad_predictions(contexts, windows, starts, ends, n_best=self.n_best,
                                 max_answer_length=self.max_answer_length)

    def evaluate_split(self, model, name: str, examples: list, device) -> dict[str, float]:
        rows = self.eval_rows[name]
        predictions = self.predict(model, rows, examples, device, self.options.eval_batch_size)
        references = {_row_id(r, i): list(r["answers"]["text"]) for i, r in enumerate(rows, start=1)}
        return task_scores(self.task.metrics, predictions, references)

    def metric_probe(self):
        return answer_probe()


def _row_id(row: dict, line: int) -> str:
    """The id `SquadEncoder` gives a row's windows."""
    return str(row.get("id", line))
