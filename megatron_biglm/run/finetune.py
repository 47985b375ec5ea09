"""The fine-tuning driver: `finetune(cfg)` plans the run from its loaded config (`plan.py`:
recipe, start shape, schedule, validation) and runs the plan's config through `train()` with
the task's recipe and validator; `finetune.train_examples=0` scores the start point instead
(`start_scores.py`). The run directory is claimed for this run (`run_claim.py`) once its start
has passed every check; the run holds the run directory's lock (`run_lock.py`) from before
its plan reads anything, and a run_dir holding the run's own inputs is refused (`run_dir.py`).
Writes `results.json` in the run directory and the `best` pointer beside `latest`."""
from __future__ import annotations

from megatron_biglm.config import RunConfig

from .plan import plan_finetune
from .run_claim import check_run_dir
from .run_dir import check_inputs_outside
from .run_lock import run_dir_lock
from .start_scores import score_start
from .train import train


def finetune(cfg: RunConfig, *, callbacks=()) -> dict:
    """Run (or resume) a fine-tune; return the results (what results.json holds) and the
    `TrainResult` under "train"."""
    check_inputs_outside(cfg)  # before any input is read
    with run_dir_lock(cfg.run_dir, say=lambda note: print(f"finetune: {note}", flush=True)):
        plan = plan_finetune(cfg)
        # refuses another run; the record is written once started. The run as its command gave it:
        # what the plan derives (the start's shape, the schedule, a kind's settled options) follows from it
        claim, overwritten = check_run_dir(cfg)
        for note in [*plan.notes, *([overwritten] if overwritten else [])]:
            print(f"finetune: {note}", flush=True)
        if plan.train_steps == 0:
            return score_start(plan, claim)
        result = train(plan.config, recipe=plan.recipe, callbacks=[claim, plan.validator, *callbacks])
        out = plan.validator.results()
        out["train"] = result.__dict__
        return out
