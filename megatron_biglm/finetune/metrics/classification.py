"""Classification and regression scores: accuracy and macro-F1 (SuperGLUE scores CB with macro-F1
because its labels are skewed), multi-label F1 and subset accuracy, Pearson and Spearman."""
from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np


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


def multilabel_f1(predictions: Sequence[tuple], labels: Sequence[tuple], classes: Sequence[int] | None = None,
                  average: str = "micro") -> float:
    """F1 of label sets (each a tuple of label indices): "micro" pools every (row, label)
    decision; "macro" averages the per-label F1 (a label in neither: F1 = 0, as scikit-learn's
    `zero_division=0`)."""
    _same_length(predictions, labels)
    pred, gold = [set(p) for p in predictions], [set(g) for g in labels]
    classes = sorted(set().union(*pred, *gold)) if classes is None else list(classes)

    def counts(c):
        tp = sum(c in p and c in g for p, g in zip(pred, gold))
        return tp, sum(c in p and c not in g for p, g in zip(pred, gold)), sum(c not in p and c in g for p, g in zip(pred, gold))

    per = [counts(c) for c in classes]
    if average == "micro":
        tp, fp, fn = (sum(x[i] for x in per) for i in range(3))
        return 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    return sum(2 * tp / (2 * tp + fp + fn) if tp else 0.0 for tp, fp, fn in per) / max(len(per), 1)


def subset_accuracy(predictions: Sequence[tuple], labels: Sequence[tuple]) -> float:
    """Fraction of rows whose predicted label set equals the gold set exactly."""
    _same_length(predictions, labels)
    return sum(set(p) == set(g) for p, g in zip(predictions, labels)) / len(labels)


def pearson(predictions: Sequence[float], targets: Sequence[float]) -> float:
    """Pearson's r (0 when either side is constant: no linear relation can be read)."""
    _same_length(predictions, targets)

    x, y = np.asarray(predictions, float), np.asarray(targets, float)
    x, y = x - x.mean(), y - y.mean()
    denominator = float(np.sqrt((x * x).sum() * (y * y).sum()))
    return float((x * y).sum()) / denominator if denominator > 0 else 0.0


def spearman(predictions: Sequence[float], targets: Sequence[float]) -> float:
    """Spearman's rho: Pearson's r of the ranks (ties share their mean rank, as scipy)."""
    _same_length(predictions, targets)
    return pearson(_ranks(predictions), _ranks(targets))


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks
