"""Zero-shot accuracy during training: a small suite every N steps, opt-in by config.

run/train.py builds it from the run config's `zero_shot_eval:` section and hands it to the loop
as a callback; the loop calls `on_step(step, loop_state, ctx)` after every step, which is

    hook(step, ctx.model_chunks[0], log=...)   # a `kind: zero_shot` record in metrics.jsonl

Used directly (tests, notebooks):

    hook = ZeroShotTrainingHook(ZeroShotHookConfig.from_dict({...}), tokenizer,
                                make_adapter=partial(megatron_adapter_for, tokenizer=tokenizer))
    hook(step, model, log=lambda metrics, step: ...)

It does nothing unless `enabled` and `step % every_n_steps == 0`. Then it puts the model in
eval mode, scores the tasks (with `limit` documents each, to stay cheap), restores the
previous mode and returns/logs `{"zero_shot/<task>/<metric>": value, "zero_shot/avg": ...}`.
`make_adapter(model)` turns the live model into a `MaskedLMAdapter` (for our megatron model,
`inference.megatron_adapter.megatron_adapter_for`; for other callables,
`inference.callable_adapter.CallableMaskedLMAdapter`);
HF models need none. With TP every rank must call the hook (each runs its part of the
forwards); only rank 0 logs. The megatron adapter needs PP=1 (the whole model in one chunk).
"""
from __future__ import annotations

import tempfile
from typing import Any, Callable

import torch.distributed as dist

from megatron_biglm.common.hub import hub_access
from megatron_biglm.config.zero_shot_eval import ZeroShotEvalConfig
from megatron_biglm.inference.hf_adapter import HFMaskedLMAdapter
from megatron_biglm.inference.protocol import MaskedLMAdapter, inference_token_ids

from .lm import MaskedLMEvalLM
from .tasks import SuiteTask, local_task_manager, resolve_tasks, suite_scores, write_local_task_yamls

# The settings are the run config's `zero_shot_eval:` section (config/zero_shot_eval.py).
ZeroShotHookConfig = ZeroShotEvalConfig


class ZeroShotTrainingHook:
    def __init__(self, config: ZeroShotHookConfig, tokenizer,
                 make_adapter: Callable[[Any], MaskedLMAdapter] | None = None):
        self.config = config
        self.tokenizer = tokenizer
        self.make_adapter = make_adapter
        self.suite: list[SuiteTask] = resolve_tasks(",".join(config.tasks))
        self._task_dir: tempfile.TemporaryDirectory | None = None
        self._manager = None

    def due(self, step: int) -> bool:
        return bool(self.config.enabled) and step > 0 and step % int(self.config.every_n_steps) == 0

    def __call__(self, step: int, model, log: Callable[[dict, int], None] | None = None
                 ) -> dict[str, float] | None:
        if not self.due(step):
            return None
        was_training = getattr(model, "training", False)
        model.eval()
        try:
            results = self._evaluate(model)
        finally:
            if was_training:
                model.train()
        metrics = self._metrics(results)
        if log is not None and _is_rank_zero():
            log(metrics, step)
        return metrics

    def on_step(self, step: int, loop_state, ctx) -> None:  # noqa: ARG002 - the loop's callback protocol
        """The training loop's callback: score the live model (chunk 0: PP = 1) and log the
        scores to the run's metrics as a `zero_shot` record at this step."""
        self(step, ctx.model_chunks[0],
             log=lambda metrics, at: ctx.metrics.log({"kind": "zero_shot", "step": at, **metrics}))

    def _evaluate(self, model) -> dict:
        import lm_eval  # lazy: optional (eval extra)



        cfg = self.config
        if self.make_adapter is not None:
            adapter = self.make_adapter(model)
        else:
            adapter = HFMaskedLMAdapter(model, inference_token_ids(self.tokenizer),
                                        split_attention="on")
        lm = MaskedLMEvalLM(adapter, self.tokenizer, scoring=cfg.scoring, beam=cfg.beam,
                            batch_size=cfg.batch_size, progress=False)
        names = [t.name for t in self.suite]
        with hub_access(f"the zero-shot tasks {', '.join(names)}",
                        "zero_shot_eval.data_dir=DIR (each task's <task>.jsonl in its HF schema)"):
            return lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=self._task_manager(),
                                           limit=cfg.limit, log_samples=False, bootstrap_iters=0)

    def _task_manager(self):
        """Built once: local YAMLs (offline) or lm-eval's default index."""
        if self._manager is None:
            if self.config.data_dir:
                self._task_dir = tempfile.TemporaryDirectory(prefix="biglm-hook-tasks-")
                write_local_task_yamls([t.name for t in self.suite], self.config.data_dir,
                                       self._task_dir.name)
                self._manager = local_task_manager(self._task_dir.name)
            else:
                from lm_eval.tasks import TaskManager  # lazy: optional (eval extra)

                self._manager = TaskManager()
        return self._manager

    def _metrics(self, results: dict) -> dict[str, float]:
        prefix = self.config.metric_prefix
        scores = suite_scores(results, self.suite)
        out = {f"{prefix}/{t.name}/{t.metric}": scores[t.name] / 100.0
               for t in self.suite if scores[t.name] is not None}
        if out:
            out[f"{prefix}/avg"] = sum(out.values()) / len(out)
        return out


def _is_rank_zero() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
