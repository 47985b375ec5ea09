"""Small fake prediction sets, one per shape a kind hands its metrics (`task_scores`), so a
user metric (`module:function`) is called once before training: a wrong signature, a return
that is no number, or a dict without the selected score fails at the start, not after an epoch.

A `MetricProbe` is (predictions, references, keyword arguments) exactly as the kind's
`evaluate_split` passes them; each kind's `metric_probe()` returns its own (None: the kind
scores no user metric).
"""
from __future__ import annotations

from typing import NamedTuple


class MetricProbe(NamedTuple):
    predictions: object
    references: object
    kwargs: dict


def label_probe(num_classes: int) -> MetricProbe:
    """Label indices (single-label classification), as many classes as the task has."""
    n = max(int(num_classes), 2)
    return MetricProbe([0, 1, 0, n - 1], [0, 1, 1, n - 1], {"classes": list(range(n))})


def label_set_probe(num_labels: int) -> MetricProbe:
    """Tuples of label indices (multi-label classification)."""
    last = max(int(num_labels), 1) - 1
    return MetricProbe([(0,), (0, last), (), (last,)], [(0,), (last,), (), (0, last)],
                       {"classes": list(range(last + 1))})


def number_probe() -> MetricProbe:
    """Numbers (regression)."""
    return MetricProbe([0.5, 1.0, 2.0, 3.0], [0.0, 1.5, 2.0, 2.5], {})


def answer_probe() -> MetricProbe:
    """{id: predicted text} and {id: [gold texts]} (extractive QA, SQuAD's shape)."""
    return MetricProbe({"1": "red", "2": "blue sky"}, {"1": ["red"], "2": ["green", "a blue sky"]}, {})


def text_probe() -> MetricProbe:
    """Generated texts and their reference texts (seq2seq)."""
    return MetricProbe(["a red apple", "the sky"], ["a red apple", "a blue sky"], {})
