"""Which task head a fine-tuned run carries, and the HF form it exports as.

A `head` or `span` fine-tune (`finetune.task` of that kind) trains `BiGLMHeadModel`: the
trunk plus `task_head.*`; the checkpoint's `task_head.json` says which head it is. Export writes the trunk exactly as for the masked-LM model and the
head as the matching EuroBERT class, so plain transformers loads it:

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
Everything else (pretraining, verbalizer, seq2seq runs) exports as EuroBertForMaskedLM.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .weight_table import WEIGHT_TABLE, head_table

HF_CLASSES = {"classification": "EuroBertForSequenceClassification", "span": "EuroBertForTokenClassification"}
HF_POOLING = {"mean": "mean", "first": "bos"}


@dataclass(frozen=True)
class ExportHead:
    head: str
    options: dict = field(default_factory=dict)
    label_names: tuple[str, ...] = ()
    note: str | None = None  # for the conversion summary, e.g. why the labels are unnamed
    problem_type: str = "single_label_classification"   # HF's: also regression, multi_label_classification

    @property
    def table(self):
        return WEIGHT_TABLE + head_table(self.head, **self.options)

    def configure(self, hf_config) -> None:
        """Turn the trunk's EuroBertConfig into the head class's config (in place)."""
        hf_config.architectures = [HF_CLASSES[self.head]]
        names = self.label_names
        hf_config.id2label = {i: str(n) for i, n in enumerate(names)}
        hf_config.label2id = {str(n): i for i, n in enumerate(names)}
        if self.head == "classification":
            hf_config.classifier_pooling = HF_POOLING[self.options.get("pooling", "mean")]
            hf_config.problem_type = self.problem_type


def export_head(checkpoint) -> ExportHead | None:
    """The task head a checkpoint holds, from its task-head record (`checkpoint/task_head.py`;
    `TrainedCheckpoint.task_head` reads a checkpoint saved without one through its one
    migration), or None when it has the masked-LM head."""
    from megatron_biglm.model.head_model import head_of_record

    record, note = checkpoint.task_head()
    found = head_of_record(record)
    if found is None:
        return None
    head, options = found
    return ExportHead(head, options, tuple(record.id2label), note=note, problem_type=record.problem_type)
