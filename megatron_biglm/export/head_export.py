"""Which task head a fine-tuned run carries, and the HF form it exports as.

A `head` or `span` fine-tune (`finetune.task` of that kind) trains `BiGLMHeadModel`: the
trunk plus `task_head.*`; the checkpoint's `task_head.json` says which head it is, and that
head's entry (`model/task_heads.py`) says how it exports. Export writes the trunk exactly as
for the masked-LM model and the head as its entry's HF class, so plain transformers loads it;
the built-in entries:

  classification -> EuroBertForSequenceClassification: the same pooling ("mean", or "first"
      = HF's "bos"), dense, GELU, classifier; `num_labels`, `id2label` / `label2id` (the data
      set's label names, e.g. MNLI: entailment, neutral, contradiction) and `problem_type`
      (single-label, regression: one output named after the label column, multi-label: a
      sigmoid per label) from the record, so `pipeline("text-classification")` applies the
      right function.
  span           -> EuroBertForTokenClassification with 2 labels, "start" and "end":
      transformers has no EuroBertForQuestionAnswering; its logits[..., 0] / [..., 1] are the
      start / end logits (our head is the same linear map; HF does not mask padding, so
      compare at valid positions).
config.json also carries the record itself (`biglm_task_head`), which the import reads back.
Everything else (pretraining, verbalizer, seq2seq runs) exports as EuroBertForMaskedLM.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from megatron_biglm.model.head_model import head_of_record
from megatron_biglm.model.heads import task_head

from .weight_table import WEIGHT_TABLE, head_rows


@dataclass(frozen=True)
class ExportHead:
    """A checkpoint's task head as it exports: its record (`task_head.json`), the options that
    build it, and a note for the conversion summary (e.g. why the labels are unnamed)."""

    record: object          # checkpoint.task_head.HeadRecord
    options: dict = field(default_factory=dict)
    note: str | None = None

    @property
    def head(self) -> str:
        return self.record.head

    @property
    def label_names(self) -> tuple[str, ...]:
        return tuple(self.record.id2label)

    @property
    def problem_type(self) -> str:
        return self.record.problem_type

    @property
    def table(self):
        return WEIGHT_TABLE + head_rows(self.head, self.options)

    def configure(self, hf_config) -> None:
        """Turn the trunk's EuroBertConfig into the head class's config (in place): the
        fields the head's entry gives (`TaskHead.hf_fields`)."""
        for key, value in task_head(self.head).hf_fields(self.record).items():
            setattr(hf_config, key, value)


def export_head(checkpoint) -> ExportHead | None:
    """The task head a checkpoint holds, from its task-head record (`checkpoint/task_head.py`;
    `TrainedCheckpoint.task_head` reads a checkpoint saved without one through its one
    migration), or None when it has the masked-LM head."""
    record, note = checkpoint.task_head()
    found = head_of_record(record)
    if found is None:
        return None
    return ExportHead(record, found[1], note=note)
