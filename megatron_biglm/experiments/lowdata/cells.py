"""The real cell runners of the low-data sweep: every cell is one run of the fine-tuning driver
(`run.finetune`) on the sweep's base config, loaded once per cell, with the cell's settings derived on top:

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

import dataclasses
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from megatron_biglm.config import RunConfig, derive, load_config
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
    sweep's command line) go before the cell's own settings, which are set typed on top."""
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

    def cell_config(self, cell: Cell) -> RunConfig:
        """The cell's run config: the sweep's config and command line, then the cell's settings."""
        if cell.paradigm == "head" and cell.n == 0:
            raise ValueError("head fine-tuning has no N = 0 cell (an untrained head is no model)")
        run = self.run_dir(cell)
        files = task_files(self.data_dir, cell.task, cell.n)
        base = load_config(self.config, list(self.overrides))
        replace = dataclasses.replace
        tuned = replace(base.finetune, task=f"{cell.task}_head" if cell.paradigm == "head" else cell.task,
                        init_from=self.start_point(cell.paradigm), train_examples=cell.n,
                        data={**base.finetune.data, **files})
        optimizer = base.optimizer
        if cell.n > 0:
            tuned = replace(tuned, epochs=1, min_steps=self.steps, validate_every_steps=self.steps)
            optimizer = replace(optimizer, lr=self.lr)
        return derive(base, run_dir=str(run), finetune=tuned, optimizer=optimizer,
                      checkpoint=replace(base.checkpoint, dir=str(run / "checkpoints"), load="auto"),
                      data=replace(base.data, seed=cell.seed), training=replace(base.training, seed=cell.seed))

    def __call__(self, cell: Cell) -> float:
        results = finetune(self.cell_config(cell))
        if not results["finished"] or not results["validations"]:
            raise RuntimeError(f"cell {cell.key} stopped before its last validation (see {self.run_dir(cell)}); "
                               f"rerun the sweep to resume it")
        last = results["validations"][-1]["valid"][results["select"]["split"]]
        score = float(last[results["select"]["metric"]])
        if not self.keep_checkpoints:
            shutil.rmtree(self.run_dir(cell) / "checkpoints", ignore_errors=True)
        return score
