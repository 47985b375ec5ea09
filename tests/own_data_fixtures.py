"""A user's own data, as a new user has it: csv files with their own column names and labels.

Reviews (`review,sentiment`): eight words of Shakespeare's vocabulary, one of them a cue word
that says the sentiment (`pos` or `neg`, balanced: chance is 0.5). A tiny model learns to read
the cue in a few hundred steps. Scores (`text,score`): the score is the number of "good" cue
words minus the number of "bad" ones in the text plus a little noise, a regression target a
tiny model can learn. Topics (`text,topics`): each of three topic words present puts its
topic in the row's label list (multi-label, joined by ","). Every file is written by Python's
csv module with a UTF-8 byte-order mark, as spreadsheet programs save them.
"""
from __future__ import annotations

import csv
import random
from pathlib import Path

FILLER = ["the", "king", "lord", "night", "day", "sword", "heart", "love", "time", "man", "world", "eyes",
          "death", "life", "honour", "blood", "heaven", "father", "son", "queen", "crown", "grace"]
GOOD = ["sweet", "noble", "gentle", "fair", "good"]
BAD = ["foul", "vile", "wicked", "base", "false"]
TOPICS = {"war": "sword", "love": "love", "court": "crown"}


def _write(path: Path, header: list[str], rows: list[list]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8-sig", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


def review_rows(n: int, seed: int) -> list[list]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        positive = i % 2 == 0
        words = [rng.choice(FILLER) for _ in range(7)]
        words.insert(rng.randrange(8), rng.choice(GOOD if positive else BAD))
        out.append([" ".join(words), "pos" if positive else "neg"])
    rng.shuffle(out)
    return out


def score_rows(n: int, seed: int) -> list[list]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        good, bad = rng.randint(0, 3), rng.randint(0, 3)
        words = [rng.choice(FILLER) for _ in range(8 - good - bad)] + \
            [rng.choice(GOOD) for _ in range(good)] + [rng.choice(BAD) for _ in range(bad)]
        rng.shuffle(words)
        out.append([" ".join(words), f"{good - bad + rng.gauss(0, 0.1):.3f}"])
    return out


def topic_rows(n: int, seed: int) -> list[list]:
    rng = random.Random(seed)
    fillers = [w for w in FILLER if w not in TOPICS.values()]
    out = []
    for _ in range(n):
        present = [t for t in TOPICS if rng.random() < 0.4]
        words = [rng.choice(fillers) for _ in range(8 - len(present))] + [TOPICS[t] for t in present]
        rng.shuffle(words)
        out.append([" ".join(words), ",".join(present)])
    return out


def write_reviews(folder: Path, n_train: int = 256, n_valid: int = 96) -> dict:
    return {"train": _write(folder / "reviews_train.csv", ["review", "sentiment"], review_rows(n_train, 1)),
            "validation": _write(folder / "reviews_valid.csv", ["review", "sentiment"], review_rows(n_valid, 2))}


def write_scores(folder: Path, n_train: int = 384, n_valid: int = 128) -> dict:
    return {"train": _write(folder / "scores_train.csv", ["text", "score"], score_rows(n_train, 3)),
            "validation": _write(folder / "scores_valid.csv", ["text", "score"], score_rows(n_valid, 4))}


def write_topics(folder: Path, n_train: int = 384, n_valid: int = 128) -> dict:
    return {"train": _write(folder / "topics_train.csv", ["text", "topics"], topic_rows(n_train, 5)),
            "validation": _write(folder / "topics_valid.csv", ["text", "topics"], topic_rows(n_valid, 6))}


def cue_rows(n: int, seed: int) -> list[list]:
    """A review and its cue word (the word that gives its sentiment): a seq2seq target."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        cue = rng.choice(GOOD + BAD)
        words = [rng.choice(FILLER) for _ in range(7)]
        words.insert(rng.randrange(8), cue)
        out.append([" ".join(words), cue])
    return out


def write_cues(folder: Path, n_train: int = 384, n_valid: int = 64) -> dict:
    return {"train": _write(folder / "cues_train.csv", ["review", "cue"], cue_rows(n_train, 7)),
            "validation": _write(folder / "cues_valid.csv", ["review", "cue"], cue_rows(n_valid, 8))}
