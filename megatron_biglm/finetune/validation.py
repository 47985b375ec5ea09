"""Validation with the task's metric, best-checkpoint selection and results.json.

`TaskValidator` is a loop callback (training/loop.py): every `interval` steps (an epoch by
default) and at the last step, the live model predicts every evaluation split (and the
test split, if any) through the recipe's `evaluate_split`, the record goes to the recipe's
history (saved in the checkpoint of that step, so a resume continues it), to metrics.jsonl
(`kind: finetune_valid`) and to results.json. A checkpoint is saved at each validation
step (the entry point sets `checkpoint.save_interval` to the interval); once it is sealed,
`on_save` points `best` (beside `latest`) at the best validation's checkpoint, which
`checkpoint.keep_last` never deletes. Best = highest `select_metric` on `select_split`
(lowest for an error such as `mse`); a tie keeps the earlier one. After each validation the
run's evaluate callbacks hear the scores (`training/callbacks.py`), and with
`finetune.early_stopping_patience: N` the run stops (saved, resumable) once N validations in
a row have not beaten the best.

results.json names only sealed checkpoints: `best_checkpoint` and `finished` wait for the
checkpoint's seal (results.json is written again once it is), so a save that fails (a full
disk) never leaves a result pointing at a checkpoint that is not there. It holds only what
the history determines (no times), so a run killed and
resumed writes the same file as an uninterrupted one. `validate` is the same scoring for a
model that is not training (the untrained start point of `finetune.train_examples=0`).
"""
from __future__ import annotations

import json
import math
import numbers
from pathlib import Path

import torch

from megatron_biglm.checkpoint.dirs import MANIFEST, best_checkpoint_name, iteration_name, point_best
from megatron_biglm.config import ConfigError

from .metrics.task_scores import score_keys, user_metric

RESULTS_FILE = "results.json"


def _is_rank0() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


#: metrics where lower is better (errors); every other score is higher-is-better
LOWER_IS_BETTER = ("mse", "loss")


def best_record(history: list[dict], split: str, metric: str) -> dict | None:
    sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
    best = None
    for record in history:
        value = sign * record["valid"][split][metric]
        if best is None or value > sign * best["valid"][split][metric]:
            best = record
    return best


def probe_user_metrics(recipe) -> None:
    """Call every user metric (`module:function`) once on the kind's small fake prediction set
    (`recipe.metric_probe()`, shaped as its validation passes them), before anything is built:
    a wrong signature, an exception, a return that is not a number or a dict of numbers, or
    a `select_metric` none of the metrics reports is a ConfigError naming the metric, instead
    of a traceback at the first validation, after an epoch."""
    task = recipe.task
    user = [name for name in task.metrics if ":" in name]
    probe = recipe.metric_probe() if user else None
    if probe is None:
        return
    keys = score_keys([name for name in task.metrics if ":" not in name])
    shown = f"predictions {_short(probe.predictions)}, references {_short(probe.references)}"
    for name in user:
        try:
            fn = user_metric(name)
        except ValueError as exc:
            raise ConfigError(f"task {task.name}: {exc}") from None
        try:
            value = fn(probe.predictions, probe.references)
        except Exception as exc:  # noqa: BLE001 - any failure of the user's code is reported, with its cause
            raise ConfigError(
                f"task {task.name}: metric {name!r} fails on a small fake prediction set of kind {task.kind} "
                f"({shown}): {type(exc).__name__}: {exc}. A metric is called as function(predictions, references) "
                "and returns a number or a dict of numbers") from None
        if isinstance(value, dict):
            bad = {k: v for k, v in value.items() if not _a_number(v)}
            if bad or not value:
                raise ConfigError(f"task {task.name}: metric {name!r} returned {_short(value)} on a small fake "
                                  f"prediction set ({shown}): a dict it returns must map score names to numbers")
            keys.extend(str(k) for k in value)
        elif _a_number(value):
            keys.append(name.rpartition(":")[2])
        else:
            raise ConfigError(f"task {task.name}: metric {name!r} returned a {type(value).__name__} "
                              f"({_short(value)}) on a small fake prediction set ({shown}): a metric returns a "
                              "number or a dict of numbers")
    if recipe.select_split is not None and recipe.select_metric not in keys:
        raise ConfigError(f"finetune.select_metric={recipe.select_metric!r} is not a score of task {task.name}: "
                          f"its metrics report {keys} (a user metric's dict on a small fake prediction set "
                          "included); select one of them, or return that key")


def _a_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class TaskValidator:
    def __init__(self, recipe, *, interval: int, steps_per_epoch: int, train_steps: int, run_dir,
                 checkpoint_root, data_summary: dict | None = None):
        self.recipe, self.interval, self.steps_per_epoch = recipe, interval, steps_per_epoch
        self.train_steps, self.run_dir, self.root = train_steps, Path(run_dir), Path(checkpoint_root)
        self.data_summary = data_summary or {}
        self.last_step = 0

    def due(self, step: int) -> bool:
        self.last_step = step
        if not self.recipe.eval_split_names():  # a task without evaluation splits trains only
            return False
        return step % self.interval == 0 or step == self.train_steps

    def on_step(self, step: int, loop_state, ctx) -> None:  # noqa: ARG002
        if not self.due(step):
            return
        chunk = ctx.model_chunks[0]
        chunk.eval()
        try:
            record = self.validate(chunk, step, ctx.info.device, ctx.metrics)
        finally:
            chunk.train()
        ctx.callbacks.evaluate(step, record["valid"], loop_state)
        reason = self.early_stop_reason()
        if reason and step < self.train_steps:
            loop_state.stop_requested = reason

    def early_stop_reason(self) -> str | None:
        """Why the run should stop now (`finetune.early_stopping_patience`), or None."""
        r = self.recipe
        patience = r.options.early_stopping_patience
        best = best_record(r.history, r.select_split, r.select_metric)
        if not patience or best is None:
            return None
        since = sum(1 for h in r.history if h["step"] > best["step"])
        if since < patience:
            return None
        return (f"early stopping: {r.select_metric} on {r.select_split} has not beaten "
                f"{best['valid'][r.select_split][r.select_metric]:.4f} (step {best['step']}) in {since} validations")

    def validate(self, model, step: int, device, metrics=None) -> dict:
        """Score `model` (in eval mode) on every evaluation split as the record of `step`:
        into the recipe's history, `metrics` (if given) and results.json. Also what scores an
        untrained start point (step 0, `finetune.train_examples=0`)."""
        r = self.recipe
        record = {"step": step, "epoch": round(step / self.steps_per_epoch, 4), "valid": {}, "test": None}
        for name in r.eval_split_names():
            record["valid"][name] = r.evaluate_split(model, name, r.eval_examples[name], device)
        if r.options.test_split:
            name = r.options.test_split
            record["test"] = {name: r.evaluate_split(model, name, r.eval_examples[name], device)}
        if r.select_metric not in record["valid"][r.select_split]:
            raise ValueError(f"finetune.select_metric={r.select_metric!r} is not among the metrics "
                             f"{sorted(record['valid'][r.select_split])} of task {r.task.name}")
        selected = record["valid"][r.select_split][r.select_metric]
        if not math.isfinite(float(selected)):
            raise ConfigError(f"finetune.select_metric={r.select_metric!r} is {selected} on {r.select_split} at step "
                              f"{step}: it cannot pick the best checkpoint; make the metric return a finite number "
                              "(or select another score of the task's metrics)")
        r.history = [h for h in r.history if h["step"] < step] + [record]
        if metrics is not None:
            flat = {f"{split}/{k}": v for split, scores in record["valid"].items() for k, v in scores.items()}
            flat.update({f"test/{k}": v for scores in (record["test"] or {}).values() for k, v in scores.items()})
            metrics.log({"kind": "finetune_valid", "step": step, "epoch": record["epoch"], **flat})
        if _is_rank0():
            self.write_results()
        return record

    def on_save(self, loop_state, path) -> None:  # noqa: ARG002
        """The `best` pointer follows the best validation, once its checkpoint is sealed."""
        best = best_record(self.recipe.history, self.recipe.select_split, self.recipe.select_metric)
        if not _is_rank0():
            return
        if best is None:
            self.write_results()
            return
        name = iteration_name(best["step"])
        if best_checkpoint_name(self.root) != name and self._sealed(best["step"]):
            point_best(self.root, best["step"])
        self.write_results()  # now naming the checkpoint just sealed

    def _sealed(self, step: int) -> bool:
        """Whether the checkpoint of `step` is sealed (its manifest written last, after every shard)."""
        return (self.root / iteration_name(step) / MANIFEST).is_file()

    def results(self) -> dict:
        r = self.recipe
        best = best_record(r.history, r.select_split, r.select_metric)
        return {
            "task": r.task.name, "kind": r.task.kind,
            "select": {"split": r.select_split, "metric": r.select_metric},
            "steps_per_epoch": self.steps_per_epoch, "train_steps": self.train_steps,
            "finished": ((bool(r.history) and r.history[-1]["step"] == self.train_steps) or
                         (not r.eval_split_names() and self.last_step == self.train_steps))
                        and (self.train_steps == 0 or self._sealed(self.train_steps)),
            "stopped_early": (self.early_stop_reason() if r.history and r.history[-1]["step"] < self.train_steps
                              else None),
            "validations": r.history,
            "best_step": best["step"] if best else None,
            "best_epoch": best["epoch"] if best else None,
            "best_metric": best["valid"][r.select_split][r.select_metric] if best else None,
            # step 0: untrained; a checkpoint not yet (or never) sealed is not named
            "best_checkpoint": iteration_name(best["step"]) if best and best["step"] and self._sealed(best["step"]) else None,
            "best_valid": best["valid"] if best else None,
            "test": best["test"] if best else None,
            "data": self.data_summary,
        }

    def write_results(self) -> Path:
        path = self.run_dir / RESULTS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.results(), indent=1))
        tmp.replace(path)
        return path
