"""The files a README user brings before running a block (a corpus, task data in the HF schema,
prompts), written small by the README test into its workspace. Each README block's marker names
the ones it needs (`inputs: ...`); the text comes from the quickstart's own corpus.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import zstandard

QUICKSTART_CORPUS = Path("runs/quickstart/corpus/shakespeare.jsonl")


def _lines(ws: Path, n: int, seed: int) -> list[str]:
    """`n` non-empty lines of 4+ words from the quickstart's corpus, drawn with `seed`."""
    docs = [json.loads(line)["text"] for line in (ws / QUICKSTART_CORPUS).read_text(encoding="utf-8").splitlines()]
    lines = [ln.strip() for doc in docs for ln in doc.splitlines() if len(ln.split()) >= 4]
    return random.Random(seed).sample(lines, n)


def _jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def corpus(ws: Path) -> None:
    """corpus/a.jsonl (what train_tokenizer reads) and two .jsonl.zst files (preprocess, shards)."""
    text = (ws / QUICKSTART_CORPUS).read_bytes().splitlines(keepends=True)
    half = len(text) // 2
    (ws / "corpus").mkdir(exist_ok=True)
    (ws / "corpus" / "a.jsonl").write_bytes(b"".join(text[:half]))
    for name, part in (("a", text[:half]), ("b", text[half:])):
        (ws / "corpus" / f"{name}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b"".join(part)))


def reviews(ws: Path) -> None:
    from own_data_fixtures import write_reviews

    write_reviews(ws, n_train=32, n_valid=16)


def _pairs(ws: Path, n: int, seed: int, labels) -> list[dict]:
    lines = _lines(ws, 2 * n, seed)
    return [{"premise": lines[2 * i], "hypothesis": lines[2 * i + 1], "label": i % len(labels), "idx": i}
            for i in range(n)]


def mnli(ws: Path) -> None:
    for name, seed in (("train", 1), ("dev_m", 2), ("dev_mm", 3)):
        _jsonl(ws / "mnli" / f"{name}.jsonl", _pairs(ws, 12, seed, range(3)))


def cb(ws: Path) -> None:
    for name, seed in (("train", 4), ("val", 5)):
        _jsonl(ws / "cb" / f"{name}.jsonl", _pairs(ws, 12, seed, range(3)))


def rte(ws: Path) -> None:
    for name, seed in (("train", 6), ("val", 7)):
        _jsonl(ws / "rte" / f"{name}.jsonl", _pairs(ws, 12, seed, range(2)))


def squad(ws: Path) -> None:
    for name, seed in (("train", 8), ("validation", 9)):
        rows = []
        for i, line in enumerate(_lines(ws, 8, seed)):
            answer = line.split()[1]
            rows.append({"id": f"{name}-{i}", "title": "play", "context": line,
                         "question": f"What word follows {line.split()[0]}?",
                         "answers": {"text": [answer], "answer_start": [line.index(answer)]}})
        _jsonl(ws / "data" / "finetune" / "squad" / f"{name}.jsonl", rows)


def xsum(ws: Path) -> None:
    for name, seed in (("train", 10), ("validation", 11)):
        lines = _lines(ws, 16, seed)
        _jsonl(ws / "xsum" / f"{name}.jsonl",
               [{"id": f"{name}-{i}", "document": " ".join(lines[2 * i:2 * i + 2]),
                 "summary": " ".join(lines[2 * i].split()[:4])} for i in range(8)])


def xp3(ws: Path) -> None:
    rows = [{"inputs": f"Say the first word: {line}", "targets": line.split()[0], "language": "en"}
            for line in _lines(ws, 32, 12)]
    _jsonl(ws / "xp3" / "en" / "part0.jsonl", rows)


def super_glue(ws: Path) -> None:
    for name, seed in (("train", 13), ("validation", 14)):
        _jsonl(ws / "data" / "super_glue" / "cb" / f"{name}.jsonl", _pairs(ws, 12, seed, range(3)))


def superglue(ws: Path) -> None:
    _jsonl(ws / "superglue" / "cb.jsonl", _pairs(ws, 6, 15, range(3)))
    _jsonl(ws / "superglue" / "rte.jsonl", _pairs(ws, 6, 16, range(2)))


def genset(ws: Path) -> None:
    _jsonl(ws / "genset.jsonl", [{"source": line, "reference": line.split()[-1]} for line in _lines(ws, 3, 17)])


def zero_shot_data(ws: Path) -> None:
    from eval_fixtures import write_task_data

    write_task_data(ws / "zero_shot_data", ["arc_easy", "piqa"], n=4)


def prompts(ws: Path) -> None:
    _jsonl(ws / "prompts.jsonl", [{"prompt": line} for line in _lines(ws, 2, 18)])


INPUTS = {f.__name__: f for f in (corpus, reviews, mnli, cb, rte, squad, xsum, xp3, super_glue, superglue,
                                  genset, zero_shot_data, prompts)}
