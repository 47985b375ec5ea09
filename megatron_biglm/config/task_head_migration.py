"""The one migration for a fine-tune's checkpoint saved without `task_head.json`
(`checkpoint/task_head.py`): its record is worked out once from what such a checkpoint
holds, its `task_head.*` weight names and shapes and its saved `finetune:` section (read
through the migration of moved keys, `loading.load_saved_config`), and from then on read like
a saved one. Nothing else reads a head off weight names or config keys.

  task_head.dense.weight + classifier.weight  -> HeadRecord classification: num_labels from the
      classifier's rows, pooling from `finetune.options.pooling`, problem type from the task's
      declaration (`finetune.task.problem_type`; a built-in task is single-label) and label
      names from `finetune.options.label_names` (LABEL_i, with a note, when unnamed);
  task_head.classifier.weight alone           -> HeadRecord span (start, end);
  a `contrastive` task                        -> EmbedderRecord from `finetune.options`;
  anything else                               -> None (a masked-LM model).
"""
from __future__ import annotations

from megatron_biglm.checkpoint.task_head import DEFAULT_PROMPTS, EmbedderRecord, HeadRecord
from megatron_biglm.common.config_fields import ConfigError


def migrate_task_head(checkpoint) -> tuple[HeadRecord | EmbedderRecord | None, str | None]:
    """(record, note) of a checkpoint saved without `task_head.json` (a `TrainedCheckpoint`:
    `weights()`, `run_config`, `path`); the note says what was assumed, or None."""
    finetune = checkpoint.run_config.finetune
    options = dict(getattr(finetune, "options", None) or {})
    task = finetune.task
    if isinstance(task, dict) and task.get("kind") == "contrastive":
        return EmbedderRecord(pooling=options.get("pooling", EmbedderRecord.pooling),
                              normalize=options.get("normalize", EmbedderRecord.normalize),
                              prompts={"query": options.get("query_prefix", DEFAULT_PROMPTS["query"]),
                                       "passage": options.get("passage_prefix", DEFAULT_PROMPTS["passage"])},
                              max_length=finetune.max_length), None
    weights = checkpoint.weights()
    names = {name for name in weights if name.startswith("task_head.")}
    if "task_head.dense.weight" in names:
        count = int(weights.shape("task_head.classifier.weight")[0])
        saved = tuple(options.get("label_names") or ())
        problem = (task.get("problem_type") if isinstance(task, dict) else None) or "single_label_classification"
        pooling = str(options.get("pooling", HeadRecord.pooling))
        if saved and len(saved) != count:
            raise ConfigError(f"{checkpoint.path}/config.yaml names {len(saved)} labels ({list(saved)}) but the "
                              f"classifier has {count} rows; fix its label names there (finetune.options.label_names, "
                              "or finetune.label_names as older runs saved them), or remove them to export the "
                              "labels as LABEL_0..")
        if saved:
            return HeadRecord("classification", count, pooling, problem, saved), None
        return HeadRecord("classification", count, pooling, problem, tuple(f"LABEL_{i}" for i in range(count))), \
            (f"{checkpoint.path}/config.yaml has no finetune.options.label_names: config.json names the labels "
             f"LABEL_0..LABEL_{count - 1}; set id2label there to name them")
    if "task_head.classifier.weight" in names:
        return HeadRecord("span", 2, id2label=("start", "end")), None
    return None, None
