"""Run the low-data grid: each cell once, resumable, then the CSV, PNGs and IPR table.

A paradigm's cell runner is any callable `runner(cell) -> score` (a fraction; the task's
metric: accuracy, CB macro-F1): `cells.FinetuneCells` runs each cell as a fine-tune (head:
the head recipe; prompted / instruct: the verbalizer recipe from the base or the
instruction-tuned checkpoint, N training examples drawn with the cell's seed, lr 1e-5,
>= 300 steps as “Scaling Effects of Instruction Tuning” §4.3 says); a test passes closed-form curves. A finished cell is
appended to `results.csv` at once; a rerun skips every cell already there, so an interrupted
sweep continues where it stopped.
"""
from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Callable, Mapping

from megatron_biglm.finetune.tasks.prompts import get_task

from .grid import Grid
from .results import append_result, curves, finished, ipr_table, plot_task, read_results, write_ipr_table


def task_metric(task: str) -> str:
    try:
        return get_task(task).select
    except ValueError:
        return "score"


def load_runner(spec: str) -> Callable:
    """`module:attribute` -> the callable (a factory is called once with no arguments when
    the attribute is a class)."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"a runner is given as module:callable, got {spec!r}")
    target = getattr(importlib.import_module(module), attr)
    return target() if isinstance(target, type) else target


def run_sweep(grid: Grid, runners: Mapping[str, Callable], out_dir, *, log=print) -> dict:
    """Run every unfinished cell, then write the plots and the IPR table. Returns paths and counts."""
    missing = [p for p in grid.paradigms if p not in runners]
    if missing:
        raise ValueError(f"no cell runner for paradigm(s) {missing}; give one per paradigm in {grid.paradigms}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "results.csv"
    done = finished(csv_path)
    cells = grid.cells()
    todo = [c for c in cells if c.key not in done]
    log(f"{len(cells)} cells, {len(cells) - len(todo)} already finished, {len(todo)} to run")
    for i, cell in enumerate(todo, start=1):
        start = time.monotonic()
        score = float(runners[cell.paradigm](cell))
        append_result(csv_path, cell, score, task_metric(cell.task), time.monotonic() - start)
        log(f"[{i}/{len(todo)}] {cell.task} {cell.paradigm} N={cell.n} seed={cell.seed}: {score:.4f}")
    wanted = {c.key for c in cells}
    rows = [r for r in read_results(csv_path) if (r["task"], r["paradigm"], r["n"], r["seed"]) in wanted]
    plots = []
    for task, by_paradigm in sorted(curves(rows).items()):
        path = out / f"{task}.png"
        plot_task(task, by_paradigm, path, task_metric(task))
        plots.append(path)
    table = ipr_table(rows)
    write_ipr_table(table, out / "ipr.csv", out / "ipr.md")
    return {"csv": csv_path, "plots": plots, "ipr_csv": out / "ipr.csv", "ipr_md": out / "ipr.md",
            "ran": len(todo), "skipped": len(cells) - len(todo), "ipr": table}


