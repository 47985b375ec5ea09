"""Fine-tune: `python -m megatron_biglm.cli.finetune --config examples/configs/finetune/TASK.yaml
[key=value ...]` (also under torchrun, and from SLURM via launch/finetune.sh).

The same `train()` as pretraining (one loop, backends, checkpoints, resume, SIGTERM, NaN
guard, logs) with the task's kind (finetune/kinds/, one module each) and the
validation callback (finetune/validation.py), run by the driver `megatron_biglm.run.finetune`.
Writes `results.json` in the run directory and the `best` pointer beside `latest` in the
checkpoint directory.

Start points: `finetune.init_from=CKPT` takes the weights of any checkpoint (a pretraining
run, or a `python -m megatron_biglm.cli.convert from-hf` import of an HF export or a public
EuroBERT) with a fresh optimizer and schedule; `checkpoint.load=IMPORT` does the same for a
weights-only import. Re-running the same command resumes the fine-tune's own checkpoints.
`finetune.train_examples=0` trains nothing: `init_from` is scored as it is (zero-shot;
run/start_scores.py) into the same results.json.
"""
from __future__ import annotations

import sys

from megatron_biglm.cli import run_command


def finetune(config_or_path, overrides=(), callbacks=()) -> dict:
    """The command as a function: load the config (a YAML path, a dict or None, then
    `key=value` overrides) once and fine-tune with it (`megatron_biglm.run.finetune`)."""
    from megatron_biglm.config import load_config
    from megatron_biglm.run import finetune as run_finetune

    return run_finetune(load_config(config_or_path, list(overrides)), callbacks=callbacks)


def _summary(result: dict) -> dict:
    summary = {k: result[k] for k in ("task", "best_epoch", "best_metric", "best_checkpoint", "test", "finished",
                                        "stopped_early")}
    return {"finetune": summary, "stopped_by": result["train"]["stopped_by"] if result["train"] else None}


def main(argv=None) -> int:
    return run_command(argv, description=__doc__,
                       config_help="run config YAML with a finetune: section (see examples/configs/finetune/)",
                       overrides_help="section.key=value overrides, e.g. finetune.epochs=3",
                       run=finetune, summary=_summary)


if __name__ == "__main__":
    sys.exit(main())
