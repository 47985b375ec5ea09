"""A small multiple-choice task made from real text: pick the line that follows a line.

Used by the quickstart to run lm-eval end to end on the embedded corpus, where no benchmark
data set can be downloaded. Questions are written in lm-eval's `arc_easy` schema, so the
built-in task config (prompt "Question: ...\\nAnswer:", acc and acc_norm) scores them through
`--data-dir` exactly as it scores ARC. Distractors are other lines of the same corpus, so
chance is 1 / n_choices; a model that learned the text's local structure does better.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Iterable

LABELS = "ABCDEFGH"


def verse_lines(text: str, min_words: int = 4) -> list[str]:
    """Lines of running text: no stage directions ([...]), no speaker names (ALL CAPS.)."""
    lines = []
    for raw in text.splitlines():
        line = raw.strip()
        if len(line.split()) < min_words or line.startswith("[") or line.isupper():
            continue
        lines.append(line)
    return lines


def next_line_questions(documents: Iterable[str], n_questions: int, *, n_choices: int = 4,
                        seed: int = 0) -> list[dict]:
    """`n_questions` (line, next line) pairs with `n_choices - 1` random other lines each."""
    if not 2 <= n_choices <= len(LABELS):
        raise ValueError(f"n_choices must be in [2, {len(LABELS)}], got {n_choices}")
    pairs, pool = [], []
    for doc in documents:
        lines = verse_lines(doc)
        pool.extend(lines)
        pairs.extend(zip(lines, lines[1:]))
    if len(pairs) < n_questions or len(pool) < n_choices:
        raise ValueError(f"the documents hold {len(pairs)} line pairs; {n_questions} questions were asked for")
    rng = random.Random(seed)
    questions = []
    for i, (line, answer) in enumerate(rng.sample(pairs, n_questions)):
        distractors = []
        while len(distractors) < n_choices - 1:
            candidate = rng.choice(pool)
            if candidate not in (answer, line) and candidate not in distractors:
                distractors.append(candidate)
        choices = distractors + [answer]
        rng.shuffle(choices)
        questions.append({
            "id": f"next-line-{i}", "question": line,
            "choices": {"text": choices, "label": list(LABELS[:n_choices])},
            "answerKey": LABELS[choices.index(answer)],
        })
    return questions


def write_next_line_task(documents: Iterable[str], data_dir: Path, n_questions: int = 100, *,
                         n_choices: int = 4, seed: int = 0) -> Path:
    """Write `<data_dir>/arc_easy.jsonl` (the `--data-dir` layout) and return its path."""
    path = Path(data_dir) / "arc_easy.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = next_line_questions(documents, n_questions, n_choices=n_choices, seed=seed)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path
