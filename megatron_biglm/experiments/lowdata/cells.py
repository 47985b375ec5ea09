"""The real cell runners of the low-data sweep: every cell is one run of the fine-tuning driver
(`run.finetune`) on the sweep's base config with the cell's keys, loaded once per cell:

| paradigm | task | start point (`finetune.init_from`) |
|---|---|---|
| head | `<task>_head` (a fresh classification head) | the base checkpoint |
| prompted | `<task>` (its fixed prompt and verbalizer) | the base checkpoint |
| instruct | `<task>` (the same prompt) | the instruction-tuned checkpoint |

Each cell trains on N examples drawn with the cell's seed (`finetune.train_examples=N`,
`data.seed` and `training.seed` = the seed) for `steps` steps (“Scaling Effects of Instruction Tuning” §4.3: lr 1e-5 and
> 300 steps, so the default 300; one epoch when that is longer), validating once, at the end.
The score is that validation's select metric (CB macro-F1, else accuracy) on the select
split: with 8 training examples, picking the best of several validations would report the
validation set's choice, not what N examples taught. N = 0 trains nothing
(`finetune.train_examples=0`): the start point is scored as it is.

Files: `data/<task>/<split>.jsonl` (the super_glue schema) becomes `finetune.data.<split>` for
every split there; the run directory is `out/cells/<task>/<paradigm>/n<N>_seed<seed>`. A
finished cell's checkpoints are deleted unless `keep_checkpoints` (“Scaling Effects of Instruction Tuning”'s grid is 1,260
fine-tunes); an interrupted cell keeps them, and a rerun of the sweep resumes it.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from megatron_biglm.config import load_config
from megatron_biglm.run import finetune

from .grid import Cell

LOWDATA_STEPS = 300
LOWDATA_LR = 1e-5


def task_files(data_dir, task: str, n: int) -> dict[str, str]:
    """{split: path} of the jsonl files in `data_dir/task/`; a training file is needed when N > 0."""
    folder = Path(data_dir) / task
    files = {p.stem: str(p) for p in sorted(folder.glob("*.jsonl"))}
    needed = ["validation"] + (["train"] if n > 0 else [])
    missing = [s for s in needed if s not in files]
    if missing:
        raise FileNotFoundError(f"low-data sweep: no {', '.join(f'{s}.jsonl' for s in missing)} in {folder}; "
                                f"put each split of {task} there as <split>.jsonl (the super_glue schema)")
    return files


@dataclass
class FinetuneCells:
    """`cells(cell) -> score`: one fine-tune per cell (see the module doc); `overrides` (the
    sweep's command line) go before the cell's own keys."""
    config: str | None
    data_dir: str
    out_dir: str
    base_checkpoint: str | None = None
    instruct_checkpoint: str | None = None
    steps: int = LOWDATA_STEPS
    lr: float = LOWDATA_LR
    overrides: list = field(default_factory=list)
    keep_checkpoints: bool = False

    def start_point(self, paradigm: str) -> str:
        path = self.instruct_checkpoint if paradigm == "instruct" else self.base_checkpoint
        if not path:
            which = "--instruct-checkpoint" if paradigm == "instruct" else "--base-checkpoint"
            raise ValueError(f"the {paradigm} paradigm starts from a checkpoint: give {which}")
        return str(path)

    def run_dir(self, cell: Cell) -> Path:
        return Path(self.out_dir) / "cells" / cell.task / cell.paradigm / f"n{cell.n}_seed{cell.seed}"

    def cell_overrides(self, cell: Cell) -> list[str]:
        if cell.paradigm == "head" and cell.n == 0:
            raise ValueError("head fine-tuning has no N = 0 cell (an untrained head is no model)")
        run = self.run_dir(cell)
        over = {
            "run_dir": run, "checkpoint.dir": run / "checkpoints", "checkpoint.load": "auto",
            "finetune.task": f"{cell.task}_head" if cell.paradigm == "head" else cell.task,
            "finetune.init_from": self.start_point(cell.paradigm),
            "finetune.train_examples": cell.n, "data.seed": cell.seed, "training.seed": cell.seed,
            **{f"finetune.data.{split}": path for split, path in task_files(self.data_dir, cell.task, cell.n).items()},
        }
        if cell.n > 0:
            over.update({"optimizer.lr": self.lr, "finetune.epochs": 1, "finetune.min_steps": self.steps,
                         "finetune.validate_every_steps": self.steps})
        return list(self.overrides) + [f"{k}={v}" for k, v in over.items()]

    def __call__(self, cell: Cell) -> float:
        results = finetune(load_config(self.config, self.cell_overrides(cell)))
        if not results["finished"] or not results["validations"]:
            raise RuntimeError(f"cell {cell.key} stopped before its last validation (see {self.run_dir(cell)}); "
                               f"rerun the sweep to resume it")
        last = results["validations"][-1]["valid"][results["select"]["split"]]
        score = float(last[results["select"]["metric"]])
        if not self.keep_checkpoints:
            shutil.rmtree(self.run_dir(cell) / "checkpoints", ignore_errors=True)
        return score
