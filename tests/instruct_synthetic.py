"""Synthetic instruction tasks for the learnability test: one instruction-word -> operation
mapping shared across families, so a held-out combination is learnable by transfer.

Selectors (which list position): first, second, third, last. Formats:
  * copy:  "say the <sel> word"      -> the selected word;
  * check: "is the <sel> word <w>"   -> yes / no (balanced).
Training families: copy × all selectors, check × {first, second, third}. Held out: check ×
last ("is the last word <w>"), never seen in training: answering it needs "last" (seen only
with copy) and the check format (seen only with other selectors).
"""
from __future__ import annotations

import json

import numpy as np

WORDS = ("red", "blue", "green", "black", "white", "pink", "gold", "gray", "cat", "dog", "fox", "owl")
SELECTORS = {"first": 0, "second": 1, "third": 2, "last": -1}
HELD_OUT = ("check", "last")
TEMPLATE = {"user": "question :", "separator": " input :", "assistant": " answer :", "end": ""}


def example(fmt: str, selector: str, rng: np.random.Generator, answer_yes: bool | None = None) -> dict:
    items = [str(w) for w in rng.choice(WORDS, size=int(rng.integers(4, 7)), replace=False)]
    chosen = items[SELECTORS[selector]]
    if fmt == "copy":
        return {"instruction": f"say the {selector} word", "input": " ".join(items), "output": chosen}
    yes = bool(rng.integers(2)) if answer_yes is None else answer_yes
    asked = chosen if yes else str(rng.choice([w for w in items if w != chosen]))
    return {"instruction": f"is the {selector} word {asked}", "input": " ".join(items), "output": "yes" if yes else "no"}


def training_rows(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    cells = [(f, s) for f in ("copy", "check") for s in SELECTORS if (f, s) != HELD_OUT]
    return [example(*cells[i % len(cells)], rng) for i in range(n)]


def held_out_rows(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [example(*HELD_OUT, rng, answer_yes=i % 2 == 0) for i in range(n)]


def vocabulary_texts() -> list[str]:
    return [" ".join(WORDS), " ".join(SELECTORS), "say the word is yes no question : input : answer :"]


def write_jsonl(rows, path) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
