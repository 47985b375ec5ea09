"""A small multiple-choice task made from real text: pick the line that follows a line.

Used by the quickstart to run lm-eval end to end on the embedded corpus, where no benchmark
data set can be downloaded. Questions are written in lm-eval's `arc_easy` schema, so the
built-in task config (prompt "Question: ...\\nAnswer:", acc and acc_norm) scores them through
`--data-dir` exactly as it scores ARC. Distractors are other lines of the same corpus, so
chance is 1 / n_choices; a model that learned the text's local structure does better.

`write_next_line_task_yaml` gives the quickstart's own variant of that config: the two lines
as they stand in the text (line, newline, candidate; the "Question:/Answer:" frame is text a
model trained only on plays has never seen), and lm-eval's `acc_mutual_info` beside acc and
acc_norm. A small model's likelihood of a line is mostly the line's own likelihood, the same
with or without the question, so raw acc stays near chance; acc_mutual_info ranks choices by
log P(choice | line) - log P(choice), i.e. by how much the preceding line raised each one,
which is the thing the task asks about. Measured on the quickstart's model (500 held-out
questions): acc 0.25, acc_mutual_info 0.33 and 0.38 in two runs; on an 800-step model (300 questions), the
"Question:/Answer:" frame gave acc_mutual_info 0.30 and the plain lines 0.32.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Iterable

import yaml

from .tasks import write_local_task_yamls

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


# The quickstart's lm-eval config on top of the built-in arc_easy one (see the module docstring).
NEXT_LINE_OVERRIDES = {
    "doc_to_text": "{{question}}",
    "target_delimiter": "\n",
    "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True}
                    for m in ("acc", "acc_norm", "acc_mutual_info")],
}


def write_next_line_task_yaml(data_dir: Path, yaml_dir: Path) -> Path:
    """`<yaml_dir>/arc_easy.yaml`: lm-eval's task over `<data_dir>/arc_easy.jsonl` with
    NEXT_LINE_OVERRIDES; load it with `tasks.local_task_manager(yaml_dir)`."""
    written, _ = write_local_task_yamls(["arc_easy"], data_dir, yaml_dir)
    path = written["arc_easy"]
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config.update(NEXT_LINE_OVERRIDES)
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path
