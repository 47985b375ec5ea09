"""Synthetic instruction tasks for the learnability test: instruction words mapped to
operations shared across families, so a held-out combination is learnable by transfer.

An instruction is "<verb> the <selector> word" over an input list of 4-6 distinct words;
the answer is the selected word. Selectors: first, second, last. Verbs: "say" and
"repeat" (two phrasings of the same format). Training families: every (verb, selector) pair
but one; held out: ("repeat", "last"), never seen in training: answering it needs "last"
(seen only after "say") under "repeat" (seen only with the other selectors).
"""
from __future__ import annotations

import json

import numpy as np

WORDS = ("red", "blue", "green", "black", "white", "pink", "gold", "gray", "cat", "dog", "fox", "owl")
SELECTORS = {"first": 0, "second": 1, "last": -1}
VERBS = ("say", "repeat")
HELD_OUT = ("repeat", "last")
TEMPLATE = {"user": "question :", "separator": " input :", "assistant": " answer :", "end": ""}


def example(verb: str, selector: str, rng: np.random.Generator) -> dict:
    items = [str(w) for w in rng.choice(WORDS, size=int(rng.integers(4, 7)), replace=False)]
    return {"instruction": f"{verb} the {selector} word", "input": " ".join(items),
            "output": items[SELECTORS[selector]]}


def training_rows(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    cells = [(v, s) for v in VERBS for s in SELECTORS if (v, s) != HELD_OUT]
    return [example(*cells[i % len(cells)], rng) for i in range(n)]


def held_out_rows(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [example(*HELD_OUT, rng) for _ in range(n)]


def vocabulary_texts() -> list[str]:
    return [" ".join(WORDS), " ".join(SELECTORS), " ".join(VERBS) + " the word question : input : answer :"]


def write_jsonl(rows, path) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
