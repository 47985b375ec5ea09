"""The low-data sweep (seed 001 §4.3) as one resumable command:

    python -m megatron_biglm.finetune.lowdata --out runs/lowdata \
        --tasks boolq cb copa rte wic --ns 0 8 16 32 64 128 --seeds 0 1 2 \
        --runner head=MODULE:CALLABLE --runner prompted=MODULE:CALLABLE --runner instruct=MODULE:CALLABLE

Each runner is `callable(cell) -> score` (cell: task, paradigm, n, seed). Writes
results.csv (finished cells are skipped on a rerun), <task>.png, ipr.csv and ipr.md.
"""
from __future__ import annotations

import argparse
import sys

from .grid import PARADIGMS, SEED001_NS, SEED001_SEEDS, SEED001_TASKS, Grid
from .runner import load_runner, run_sweep


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tasks", nargs="+", default=list(SEED001_TASKS))
    parser.add_argument("--paradigms", nargs="+", default=list(PARADIGMS), choices=PARADIGMS)
    parser.add_argument("--ns", nargs="+", type=int, default=list(SEED001_NS))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEED001_SEEDS))
    parser.add_argument("--runner", action="append", default=[], metavar="PARADIGM=MODULE:CALLABLE")
    args = parser.parse_args(argv)
    runners = {}
    for spec in args.runner:
        paradigm, sep, target = spec.partition("=")
        if not sep or paradigm not in PARADIGMS:
            parser.error(f"--runner takes PARADIGM=MODULE:CALLABLE with PARADIGM in {PARADIGMS}, got {spec!r}")
        runners[paradigm] = load_runner(target)
    grid = Grid(tuple(args.tasks), tuple(args.paradigms), tuple(args.ns), tuple(args.seeds))
    out = run_sweep(grid, runners, args.out)
    print(f"ran {out['ran']} cells, skipped {out['skipped']}; {out['csv']}, {len(out['plots'])} plots, {out['ipr_md']}")
    print(out["ipr_md"].read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
