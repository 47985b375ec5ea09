"""Which task head a fine-tuned run carries, and the HF form it exports as.

A `head` or `span` fine-tune (`finetune.task` of that kind) trains `BiGLMHeadModel`: the
trunk plus `task_head.*`; the checkpoint's weights say which head it is. Export writes the trunk exactly as for the masked-LM model and the
head as the matching EuroBERT class, so plain transformers loads it:

  classification -> EuroBertForSequenceClassification: the same pooling ("mean", or "first"
      = HF's "bos"), dense, GELU, classifier; `num_labels` from the classifier's rows.
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


def export_head(checkpoint) -> ExportHead | None:
    """The task head a checkpoint holds (read off its `task_head.*` weights), or None when it
    has the masked-LM head. Labels are named LABEL_0.. (the data set's label names live in
    finetune/, above this floor; set `id2label` in config.json to name them)."""
    from megatron_biglm.model.head_model import head_of_checkpoint

    found = head_of_checkpoint(checkpoint)
    if found is None:
        return None
    head, options = found
    labels = tuple(f"LABEL_{i}" for i in range(options.get("num_labels", 0)))
    return ExportHead(head, options, labels)
