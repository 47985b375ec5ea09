"""SQuAD v1.1 exact match and token F1 with the official normalisation.

normalize: lowercase, drop punctuation (`string.punctuation`), drop the articles a/an/the as
whole words, collapse whitespace -- in that order, as the official evaluate-v1.1.py does. A
prediction scores the max over its gold answers; the corpus score is the mean over questions.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Mapping, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match_score(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> float:
    """Token F1 of the normalised strings (0 when no token is shared, as in v1.1)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Mapping[str, str], references: Mapping[str, Sequence[str]]) -> dict:
    """{'exact_match', 'f1'} in [0, 1] over the questions of `references` (id -> gold texts).
    A question without a prediction scores 0 and is counted in 'missing'."""
    if not references:
        raise ValueError("no questions to score")
    em = f1 = 0.0
    missing = 0
    for qid, golds in references.items():
        if not golds:
            raise ValueError(f"question {qid!r} has no gold answer")
        if qid not in predictions:
            missing += 1
            continue
        pred = predictions[qid]
        em += max(exact_match_score(pred, g) for g in golds)
        f1 += max(f1_score(pred, g) for g in golds)
    n = len(references)
    return {"exact_match": em / n, "f1": f1 / n, "missing": missing}
