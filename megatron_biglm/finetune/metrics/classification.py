"""Accuracy and macro-F1 (SuperGLUE scores CB with macro-F1 because its labels are skewed)."""
from __future__ import annotations

from typing import Hashable, Sequence


def accuracy(predictions: Sequence[Hashable], labels: Sequence[Hashable]) -> float:
    """Fraction of predictions equal to their label."""
    _same_length(predictions, labels)
    return sum(p == g for p, g in zip(predictions, labels)) / len(labels)


def macro_f1(predictions: Sequence[Hashable], labels: Sequence[Hashable],
             classes: Sequence[Hashable] | None = None) -> float:
    """Unweighted mean over classes of F1 = 2 TP / (2 TP + FP + FN).

    `classes` defaults to every class seen in the labels or the predictions (scikit-learn's
    default); a class given in `classes` that occurs in neither counts as F1 = 0 (scikit-learn's
    `zero_division=0`), so pass it only when that is the intent."""
    _same_length(predictions, labels)
    classes = sorted(set(labels) | set(predictions), key=repr) if classes is None else list(classes)
    scores = []
    for c in classes:
        tp = sum(p == c and g == c for p, g in zip(predictions, labels))
        fp = sum(p == c and g != c for p, g in zip(predictions, labels))
        fn = sum(p != c and g == c for p, g in zip(predictions, labels))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return sum(scores) / len(scores)


def _same_length(predictions, labels) -> None:
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels")
    if not labels:
        raise ValueError("no examples to score")
