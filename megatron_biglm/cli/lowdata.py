"""The low-data sweep (“Scaling Effects of Instruction Tuning” §4.3) as one resumable command:

    python -m megatron_biglm.cli.lowdata --config examples/configs/finetune/lowdata.yaml \
        --base-checkpoint runs/biglm_136m --instruct-checkpoint runs/instruct_136m \
        --data data/super_glue --out runs/lowdata \
        [--tasks boolq cb copa rte wic] [--ns 0 8 16 32 64 128] [--seeds 0 1 2] \
        [--steps 300] [--lr 1e-5] [key=value ...]

Every cell (task × paradigm × N × seed) is one fine-tune through `run.finetune`
(experiments/lowdata/cells.py says which task, start point and overrides), one after the
other in this process; `key=value` overrides apply to every cell (put them before the list
options --tasks/--ns/--seeds, or after `--`). `--runner PARADIGM=MODULE:CALLABLE` plugs in any
`callable(cell) -> score` instead (and is the only way without `--config`). Writes
results.csv (finished cells are skipped on a rerun), <task>.png, ipr.csv and ipr.md.

One process (refused under torchrun: every rank would write the same files).
An entry point (top floor) because it hands the fine-tuning entry to the sweep's runners;
`python -m megatron_biglm.cli.lowdata` runs this module.
"""
from __future__ import annotations

import argparse
import os
import sys


def main(argv=None) -> int:
    from megatron_biglm.experiments.lowdata import PARADIGMS, Grid, load_runner, run_sweep
    from megatron_biglm.experiments.lowdata.cells import LOWDATA_LR, LOWDATA_STEPS, FinetuneCells
    from megatron_biglm.experiments.lowdata.grid import LOWDATA_NS, LOWDATA_SEEDS, LOWDATA_TASKS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tasks", nargs="+", default=list(LOWDATA_TASKS))
    parser.add_argument("--paradigms", nargs="+", default=list(PARADIGMS), choices=PARADIGMS)
    parser.add_argument("--ns", nargs="+", type=int, default=list(LOWDATA_NS))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(LOWDATA_SEEDS))
    parser.add_argument("--config", help="the fine-tuning run config every cell starts from (model, batch, ...)")
    parser.add_argument("--base-checkpoint", help="start point of the head and prompted paradigms")
    parser.add_argument("--instruct-checkpoint", help="start point of the instruct paradigm")
    parser.add_argument("--data", help="a folder with <task>/<split>.jsonl (super_glue schema) per task")
    parser.add_argument("--steps", type=int, default=LOWDATA_STEPS, help="training steps per cell (“Scaling Effects of Instruction Tuning”: > 300)")
    parser.add_argument("--lr", type=float, default=LOWDATA_LR)
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep each finished cell's checkpoints")
    parser.add_argument("--runner", action="append", default=[], metavar="PARADIGM=MODULE:CALLABLE")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides for every cell")
    args = parser.parse_args(argv)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        parser.error("the sweep runs its cells one after another in one process (every rank would write "
                     "results.csv); run it with plain python, not torchrun, and give a cell more GPUs "
                     "through --runner if needed")
    runners = {}
    for spec in args.runner:
        paradigm, sep, target = spec.partition("=")
        if not sep or paradigm not in PARADIGMS:
            parser.error(f"--runner takes PARADIGM=MODULE:CALLABLE with PARADIGM in {PARADIGMS}, got {spec!r}")
        runners[paradigm] = load_runner(target)
    fine_tuned = [p for p in args.paradigms if p not in runners]
    if args.config and fine_tuned:
        if not args.data:
            parser.error("--config needs --data DIR (DIR/<task>/<split>.jsonl)")
        needs = {"--base-checkpoint": args.base_checkpoint if {"head", "prompted"} & set(fine_tuned) else True,
                 "--instruct-checkpoint": args.instruct_checkpoint if "instruct" in fine_tuned else True}
        missing = [flag for flag, value in needs.items() if not value]
        if missing:
            parser.error(f"paradigms {fine_tuned} need {' and '.join(missing)}")
        if args.steps < 1:
            parser.error(f"--steps must be >= 1, got {args.steps}")
        if args.steps < LOWDATA_STEPS:
            print(f"note: --steps {args.steps} is below “Scaling Effects of Instruction Tuning”'s >= {LOWDATA_STEPS} steps", flush=True)
        cells = FinetuneCells(args.config, args.data, args.out, args.base_checkpoint,
                              args.instruct_checkpoint, steps=args.steps, lr=args.lr, overrides=args.overrides,
                              keep_checkpoints=args.keep_checkpoints)
        runners.update({p: cells for p in fine_tuned})
    elif args.overrides:
        parser.error(f"key=value overrides {args.overrides} apply to fine-tuned cells: give --config")
    grid = Grid(tuple(args.tasks), tuple(args.paradigms), tuple(args.ns), tuple(args.seeds))
    out = run_sweep(grid, runners, args.out)
    print(f"ran {out['ran']} cells, skipped {out['skipped']}; {out['csv']}, {len(out['plots'])} plots, {out['ipr_md']}")
    print(out["ipr_md"].read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
