"""All of a task's metrics in one flat dict, and the number that picks the best checkpoint.

    scores = task_scores(task.metrics, predictions, references)   # e.g. {"rouge1":..,"rougeL":..}
    best = scores[task.select]

Shapes: classification metrics take parallel label lists; `squad` takes {id: text} and
{id: [gold texts]}; generation metrics take parallel lists of texts (references may be
lists of texts). Keys: accuracy, macro_f1, exact_match and f1 (squad), rouge1/rouge2/rougeL,
bleu, meteor.
"""
from __future__ import annotations

from typing import Sequence

from .classification import accuracy, macro_f1
from .generation import bleu, meteor, rouge
from .squad import squad_scores


def task_scores(metrics: Sequence[str], predictions, references, **kwargs) -> dict[str, float]:
    """`kwargs` go to the metric that takes them (`classes` to macro_f1, `wordnet` to meteor)."""
    out: dict[str, float] = {}
    for name in metrics:
        if name == "accuracy":
            out["accuracy"] = accuracy(predictions, references)
        elif name == "macro_f1":
            out["macro_f1"] = macro_f1(predictions, references, kwargs.get("classes"))
        elif name == "squad":
            scores = squad_scores(predictions, references)
            out.update(exact_match=scores["exact_match"], f1=scores["f1"])
        elif name == "rouge":
            out.update(rouge(predictions, references))
        elif name == "bleu":
            out["bleu"] = bleu(predictions, references)
        elif name == "meteor":
            out["meteor"] = meteor(predictions, references, wordnet=kwargs.get("wordnet"))
        else:
            raise ValueError(f"unknown metric {name!r}")
    return out
