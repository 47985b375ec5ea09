"""The grid of “Scaling Effects of Instruction Tuning”'s low-data study (§4.3, Table 2, Figure 3): tasks × paradigms × N × seeds.

Paradigms: `head` (classification-head fine-tuning), `prompted` (the base model fine-tuned
on the fixed prompt and verbalizer), `instruct` (the instruction-tuned model, same prompt).
N = 0 exists only for the prompted paradigms (a zero-shot prompt needs no training; an
untrained head is no model), so `cells()` leaves out (head, 0).
"""
from __future__ import annotations

from dataclasses import dataclass

PARADIGMS = ("head", "prompted", "instruct")
ZERO_SHOT = ("prompted", "instruct")
LOWDATA_TASKS = ("boolq", "cb", "copa", "rte", "wic")
LOWDATA_NS = (0, 8, 16, 32, 64, 128)
LOWDATA_SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Cell:
    task: str
    paradigm: str
    n: int
    seed: int

    @property
    def key(self) -> tuple:
        return (self.task, self.paradigm, self.n, self.seed)


@dataclass(frozen=True)
class Grid:
    tasks: tuple = LOWDATA_TASKS
    paradigms: tuple = PARADIGMS
    ns: tuple = LOWDATA_NS
    seeds: tuple = LOWDATA_SEEDS

    def __post_init__(self):
        unknown = [p for p in self.paradigms if p not in PARADIGMS]
        if unknown:
            raise ValueError(f"unknown paradigms {unknown}; expected some of {PARADIGMS}")
        if any(n < 0 for n in self.ns) or not self.ns or not self.seeds or not self.tasks:
            raise ValueError(f"need tasks, seeds and N >= 0 values, got {self.tasks}, {self.seeds}, {self.ns}")

    def cells(self) -> list[Cell]:
        return [Cell(t, p, n, s) for t in self.tasks for p in self.paradigms for n in sorted(self.ns)
                for s in self.seeds if n > 0 or p in ZERO_SHOT]
