"""Which task head a fine-tuned run carries, and the HF form it exports as.

A `head` or `span` fine-tune (`finetune.task` of that kind) trains `BiGLMHeadModel`: the
trunk plus `task_head.*`. Export writes the trunk exactly as for the masked-LM model and the
head as the matching EuroBERT class, so plain transformers loads it:

  classification -> EuroBertForSequenceClassification: the same pooling ("mean", or "first"
      = HF's "bos"), dense, GELU, classifier; `num_labels`, `id2label` from the data set.
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

    @property
    def table(self):
        return WEIGHT_TABLE + head_table(self.head, **self.options)

    def configure(self, hf_config) -> None:
        """Turn the trunk's EuroBertConfig into the head class's config (in place)."""
        hf_config.architectures = [HF_CLASSES[self.head]]
        names = self.label_names if self.head == "classification" else ("start", "end")
        hf_config.id2label = {i: str(n) for i, n in enumerate(names)}
        hf_config.label2id = {str(n): i for i, n in enumerate(names)}
        if self.head == "classification":
            hf_config.classifier_pooling = HF_POOLING[self.options.get("pooling", "mean")]
            hf_config.problem_type = "single_label_classification"


def export_head(run_config) -> ExportHead | None:
    """The head of a fine-tuning run config, or None when it has the masked-LM head."""
    finetune = getattr(run_config, "finetune", None)
    if finetune is None or not finetune.enabled:
        return None
    from megatron_biglm.finetune.data_files import get_schema
    from megatron_biglm.finetune.tasks import get_task

    task = get_task(finetune.task)
    if task.kind == "head":
        labels = get_schema(task.dataset).label_names
        return ExportHead("classification", {"num_labels": len(labels),
                                             "pooling": str(finetune.get("pooling", "mean"))}, tuple(labels))
    if task.kind == "span":
        return ExportHead("span")
    return None
