"""Score a start point without training it (`finetune.train_examples=0`): “Scaling Effects of Instruction Tuning”'s N = 0
point of the prompted and instruction-tuned curves (the prompt read zero-shot).

Training zero steps through the loop is no run (the schedule needs a step, and the loop's
callbacks fire after steps), so the start point is loaded for inference (TP=1, PP=1, this
process) and scored by the validator's own `validate` as the record of step 0: the same
results.json, with the same metrics and row counts, as a trained run writes, `finished`
true at 0 steps.
"""
from __future__ import annotations

from pathlib import Path

from megatron_biglm.config import save_resolved
from megatron_biglm.inference.loading import load_megatron_checkpoint, resolve_device
from megatron_biglm.training.build import resolve_precision

#: the precision training would run at (training.build.resolve_precision) -> the loader's dtype,
#: so the N = 0 point is scored at the precision the trained cells validate at
_DTYPE = {"fp32": "float32", "bf16": "bfloat16"}


def score_start(plan, claim) -> dict:
    """Load the run's `finetune.init_from` and score it on the plan's evaluation splits (`plan.config`: the
    run config); the results dict (what results.json holds), `train` None (nothing was trained).
    `claim` (its `on_start`) records the run in run_dir once the start point has loaded."""
    cfg = plan.config
    device = resolve_device(None)
    loaded = load_megatron_checkpoint(cfg.finetune.init_from, tokenizer=cfg.data.tokenizer, device=device,
                                      dtype=_DTYPE[resolve_precision(cfg.training)], verify=cfg.checkpoint.verify)
    for note in loaded.notes:
        print(f"finetune: {note}", flush=True)
    claim.on_start()
    plan.validator.validate(loaded.model, 0, device)
    save_resolved(cfg, Path(cfg.run_dir) / "config.yaml")
    out = plan.validator.results()
    out["train"] = None
    return out
