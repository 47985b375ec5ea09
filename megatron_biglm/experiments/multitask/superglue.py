"""SuperGLUE zero-shot with the prompted verbalizer tasks (paper Table 5, "SuperGLUE AVG").

Why the verbalizer tasks: they are the prompts and label words our fine-tuning and
instruction-tuning use (`tasks/prompts.py`), so a zero-shot number here is the same
measurement as the N = 0 point of the low-data study. Each example is laid out by
`VerbalizerEncoder` (`[BOS] prompt [MASK]*K rest [EOS]`, `split` at the first slot) and run
through an inference adapter (HF export or megatron checkpoint) with that split; the
prediction is the argmax over labels of `label_scores` (sum of the label tokens' log-probs
at the slots), exactly the recipe's rule.

Tasks: the five SuperGLUE tasks with prompts, BoolQ, CB, COPA, RTE and WiC (“Scaling Effects of Instruction Tuning”'s
subset; MultiRC, ReCoRD and WSC have none). Metric per task: accuracy, CB macro-F1 over its
three classes (SuperGLUE's convention). The average is the unweighted mean of the per-task
metrics over the tasks that have data; the output says which ran.

Data: `<dir>/<task>.jsonl` or `<dir>/<task>/validation.jsonl` in the `super_glue/<task>`
schema (`data_files.SCHEMAS`), labelled (test splits have no labels).
"""
from __future__ import annotations

from pathlib import Path

import torch

from megatron_biglm.finetune.data_files import read_rows
from megatron_biglm.finetune.kinds.verbalizer import VerbalizerEncoder, label_scores
from megatron_biglm.finetune.metrics import task_scores
from megatron_biglm.finetune.row_report import RowReport
from megatron_biglm.finetune.tasks import get_task
from megatron_biglm.inference.engine import pad

SUPERGLUE_TASKS = ("boolq", "cb", "copa", "rte", "wic")


class BadSuperGLUEData(ValueError):
    """SuperGLUE data that cannot be scored; the message says what to write."""


def task_file(data_dir, task: str) -> Path | None:
    data_dir = Path(data_dir)
    return next((p for p in (data_dir / f"{task}.jsonl", data_dir / task / "validation.jsonl")
                 if p.is_file()), None)


def load_task_rows(path, task: str) -> tuple[list[dict], RowReport]:
    """The labelled rows of one task file; no usable row is an error naming why."""
    spec = get_task(task)
    rows, report = read_rows([str(path)], spec.dataset)
    if not rows:
        reasons = "; ".join(e for shown in report.examples.values() for e in shown[:1])
        raise BadSuperGLUEData(f"{path}: no usable {spec.dataset} row ({report.summary_line()}"
                               f"{'; e.g. ' + reasons if reasons else ''}); write labelled rows in "
                               f"the {spec.dataset} schema (fields: {', '.join(spec.fields)}, label)")
    return rows, report


def predict(adapter, tokenizer, task: str, rows: list[dict], *,
            batch_size: int = 16) -> tuple[list[int], list[int], RowReport]:
    """(predicted label, gold label) per row whose prompt fits; the others are dropped and
    counted in the report."""
    spec = get_task(task)
    encoder = VerbalizerEncoder(tokenizer, spec.prompt, adapter.max_length)
    report = RowReport()
    examples = []
    for i, row in enumerate(rows):
        ex = encoder.encode(row, row["label"], report=report, source=task, line=i + 1)
        if ex is not None:
            examples.append(ex)
    pad_id = encoder.ids.pad_id
    predictions = []
    with torch.inference_mode():
        for start in range(0, len(examples), batch_size):
            chunk = examples[start:start + batch_size]
            ids, lengths = pad([e.input_ids for e in chunk], pad_id, adapter.device)
            split = torch.tensor([e.split for e in chunk], device=adapter.device)
            positions = torch.tensor([e.mask_positions for e in chunk], device=adapter.device)
            logits = adapter.logits(ids, lengths, split, positions)          # [b, K, V]
            slots = torch.arange(logits.size(1), device=logits.device).expand(len(chunk), -1)
            predictions += label_scores(logits, slots, encoder.slot_targets).argmax(-1).tolist()
    return predictions, [e.label for e in examples], report


def score_task(adapter, tokenizer, task: str, path, *, batch_size: int = 16) -> dict:
    """{"metric", "score" (fraction), "scores" (all the task's metrics), "rows", "predictions"
    (label index per scored row, in file order), "report"}."""
    spec = get_task(task)
    rows, read_report = load_task_rows(path, task)
    predictions, labels, fit_report = predict(adapter, tokenizer, task, rows, batch_size=batch_size)
    if not predictions:
        raise BadSuperGLUEData(f"{path}: no {task} prompt fits the model's {adapter.max_length} "
                               f"positions ({fit_report.summary_line()})")
    scores = task_scores(spec.metrics, predictions, labels,
                         classes=list(range(len(spec.prompt.label_words))))
    return {"metric": spec.select, "score": scores[spec.select], "scores": scores,
            "rows": len(predictions), "file": str(path), "predictions": predictions,
            "report": {"read": read_report.summary_line(), "fit": fit_report.summary_line()}}


def check_superglue_dir(data_dir, tasks=SUPERGLUE_TASKS) -> dict[str, Path | None]:
    """task -> its file (None when absent), after reading every file present: a wrong schema
    fails here, before any model is loaded."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise BadSuperGLUEData(f"--superglue-data {data_dir} is not a directory; give a directory "
                               f"of <task>.jsonl for {', '.join(tasks)}")
    found = {t: task_file(data_dir, t) for t in tasks}
    if all(p is None for p in found.values()):
        raise BadSuperGLUEData(f"no SuperGLUE task file in {data_dir}: write <task>.jsonl (or "
                               f"<task>/validation.jsonl) for some of {', '.join(tasks)}")
    for task, path in found.items():
        if path is not None:
            load_task_rows(path, task)
    return found


def evaluate_superglue(adapter, tokenizer, data_dir, *, tasks=SUPERGLUE_TASKS,
                       batch_size: int = 16) -> dict:
    """Per-task results, the average (fraction) over the tasks with data, and those without."""
    found = check_superglue_dir(data_dir, tasks)
    missing = [t for t, p in found.items() if p is None]
    results = {t: score_task(adapter, tokenizer, t, p, batch_size=batch_size)
               for t, p in found.items() if p is not None}
    average = sum(r["score"] for r in results.values()) / len(results)
    return {"tasks": results, "average": average, "missing": missing,
            "average_over": sorted(results)}
