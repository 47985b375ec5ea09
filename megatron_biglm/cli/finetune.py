"""Fine-tune: `python -m megatron_biglm.cli.finetune --config examples/configs/finetune/TASK.yaml
[key=value ...]` (also under torchrun, and from SLURM via launch/finetune.sh).

The same `train()` as pretraining (one loop, backends, checkpoints, resume, SIGTERM, NaN
guard, logs) with the task's recipe (finetune/recipes/, picked by the task's kind) and the
validation callback (finetune/validation.py). Writes `results.json` in the run directory
and the `best` pointer beside `latest` in the checkpoint directory.

Start points: `finetune.init_from=CKPT` takes the weights of any checkpoint (a pretraining
run, or a `python -m megatron_biglm.cli.convert from-hf` import of an HF export or a public
EuroBERT) with a fresh optimizer and schedule; `checkpoint.load=IMPORT` does the same for a
weights-only import. Re-running the same command resumes the fine-tune's own checkpoints.
`finetune.train_examples=0` trains nothing: `init_from` is scored as it is (zero-shot;
finetune/start_scores.py) into the same results.json.

Top floor (`cli/`): it wires finetune/ into `cli.train.train`.
"""
from __future__ import annotations

import sys


def finetune(config_or_path, overrides=(), callbacks=()) -> dict:
    """Run (or resume) a fine-tune; return the results (what results.json holds) and the
    `TrainResult` under "train"."""
    from megatron_biglm.finetune.plan import plan_finetune
    from megatron_biglm.finetune.run_claim import check_run_dir
    from megatron_biglm.finetune.start_scores import score_start
    from megatron_biglm.cli.train import train

    plan = plan_finetune(config_or_path, overrides)
    claim, overwritten = check_run_dir(plan.config)  # refuses another run; the record is written once started
    for note in [*plan.notes, *([overwritten] if overwritten else [])]:
        print(f"finetune: {note}", flush=True)
    if plan.train_steps == 0:
        return score_start(plan, claim)
    result = train(config_or_path, plan.overrides, callbacks=[claim, plan.validator, *callbacks],
                   recipe=plan.recipe, init_from=plan.init_from)
    out = plan.validator.results()
    out["train"] = result.__dict__
    return out


def _summary(result: dict) -> dict:
    summary = {k: result[k] for k in ("task", "best_epoch", "best_metric", "best_checkpoint", "test", "finished",
                                        "stopped_early")}
    return {"finetune": summary, "stopped_by": result["train"]["stopped_by"] if result["train"] else None}


def main(argv=None) -> int:
    from megatron_biglm.cli.train import cli_main

    return cli_main(argv, description=__doc__,
                    config_help="run config YAML with a finetune: section (see examples/configs/finetune/)",
                    overrides_help="section.key=value overrides, e.g. finetune.epochs=3",
                    run=finetune, summary=_summary)

if __name__ == "__main__":
    sys.exit(main())
