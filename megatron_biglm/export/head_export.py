"""Which task head a fine-tuned run carries, and the HF form it exports as.

A `head` or `span` fine-tune (`finetune.task` of that kind) trains `BiGLMHeadModel`: the
trunk plus `task_head.*`; the checkpoint's weights say which head it is. Export writes the trunk exactly as for the masked-LM model and the
head as the matching EuroBERT class, so plain transformers loads it:

  classification -> EuroBertForSequenceClassification: the same pooling ("mean", or "first"
      = HF's "bos"), dense, GELU, classifier; `num_labels` from the classifier's rows,
      `id2label` / `label2id` from the run config's `finetune.label_names` (the fine-tune
      writes the data set's label names there, e.g. MNLI: entailment, neutral,
      contradiction); a checkpoint without them gets LABEL_0, LABEL_1, ... and a note;
      `problem_type` from `finetune.problem_type` (single-label, regression: one output named
      after the label column, multi-label: a sigmoid per label), so `pipeline(
      "text-classification")` applies the right function.
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
        names = self.label_names if self.head == "classification" else ("start", "end")
        hf_config.id2label = {i: str(n) for i, n in enumerate(names)}
        hf_config.label2id = {str(n): i for i, n in enumerate(names)}
        if self.head == "classification":
            hf_config.classifier_pooling = HF_POOLING[self.options.get("pooling", "mean")]
            hf_config.problem_type = self.problem_type


def export_head(checkpoint) -> ExportHead | None:
    """The task head a checkpoint holds (read off its `task_head.*` weights), or None when it
    has the masked-LM head; a classification head's label names from the saved run config."""
    from megatron_biglm.config import ConfigError
    from megatron_biglm.model.head_model import head_of_checkpoint

    found = head_of_checkpoint(checkpoint)
    if found is None:
        return None
    head, options = found
    if head != "classification":
        return ExportHead(head, options)
    count = options["num_labels"]
    finetune = checkpoint.run_config.finetune
    saved = tuple(finetune.label_names or ())
    problem = finetune.problem_type or "single_label_classification"
    if saved and len(saved) != count:
        raise ConfigError(f"{checkpoint.path}/config.yaml names {len(saved)} labels ({list(saved)}) but the "
                         f"classifier has {count} rows; fix finetune.label_names there, or remove it to "
                         "export the labels as LABEL_0..")
    if saved:
        return ExportHead(head, options, saved, problem_type=problem)
    return ExportHead(head, options, tuple(f"LABEL_{i}" for i in range(count)), problem_type=problem,
                      note=f"{checkpoint.path}/config.yaml has no finetune.label_names: config.json names the "
                           f"labels LABEL_0..LABEL_{count - 1}; set id2label there to name them")
