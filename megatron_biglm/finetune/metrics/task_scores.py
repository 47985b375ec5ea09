"""All of a task's metrics in one flat dict, and the number that picks the best checkpoint.

    scores = task_scores(task.metrics, predictions, references)   # e.g. {"rouge1":..,"rougeL":..}
    best = scores[task.select]

Shapes: classification metrics take parallel label lists; regression metrics (pearson,
spearman, mse) parallel lists of numbers; multi-label metrics (micro_f1, and macro_f1 /
subset_accuracy when the labels are tuples) parallel lists of label-index tuples; `squad` takes
{id: text} and {id: [gold texts]}; generation metrics take parallel lists of texts (references
may be lists of texts). Keys: accuracy, macro_f1, exact_match and f1 (squad), rouge1/rouge2/
rougeL, bleu, meteor, pearson, spearman, mse, micro_f1, subset_accuracy.

A user metric is a function named `module:function` (importable from the run's Python path):
called as `function(predictions, references)`, it returns a number (the score is keyed by the
function's name) or a dict of numbers (keyed as returned).
"""
from __future__ import annotations

import importlib
from typing import Callable, Sequence

from .classification import accuracy, macro_f1, multilabel_f1, pearson, spearman, subset_accuracy
from .generation import bleu, meteor, rouge
from .squad import squad_scores

#: the score keys each built-in metric writes
_KEYS = {"squad": ("exact_match", "f1"), "rouge": ("rouge1", "rouge2", "rougeL"),
         "retrieval": ("ndcg@10", "recall@100", "mrr@10")}  # retrieval, loss: scored by their recipes


def score_keys(metrics: Sequence[str]) -> list[str]:
    """The keys `task_scores` writes for `metrics` (a user function: its name)."""
    out: list[str] = []
    for name in metrics:
        out.extend(_KEYS.get(name, (name.rpartition(":")[2],)))
    return out


def user_metric(name: str) -> Callable:
    module, _, function = name.partition(":")
    try:
        fn = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"metric {name!r}: cannot import {function} from {module} ({exc}); put the module on "
                         "the Python path (PYTHONPATH) or fix the name") from None
    if not callable(fn):
        raise ValueError(f"metric {name!r} is not a function")
    return fn


def task_scores(metrics: Sequence[str], predictions, references, **kwargs) -> dict[str, float]:
    """`kwargs` go to the metric that takes them (`classes` to macro_f1, `wordnet` to meteor)."""
    out: dict[str, float] = {}
    multi = isinstance(references, (list, tuple)) and bool(references) and isinstance(references[0], tuple)
    for name in metrics:
        if name == "accuracy":
            out["accuracy"] = accuracy(predictions, references)
        elif name == "macro_f1":
            out["macro_f1"] = (multilabel_f1(predictions, references, kwargs.get("classes"), average="macro")
                               if multi else macro_f1(predictions, references, kwargs.get("classes")))
        elif name == "micro_f1":
            out["micro_f1"] = multilabel_f1(predictions, references, kwargs.get("classes"), average="micro")
        elif name == "subset_accuracy":
            out["subset_accuracy"] = subset_accuracy(predictions, references)
        elif name == "pearson":
            out["pearson"] = pearson(predictions, references)
        elif name == "spearman":
            out["spearman"] = spearman(predictions, references)
        elif name == "mse":
            out["mse"] = sum((float(p) - float(g)) ** 2 for p, g in zip(predictions, references)) / len(references)
        elif name == "squad":
            scores = squad_scores(predictions, references)
            out.update(exact_match=scores["exact_match"], f1=scores["f1"])
        elif name == "rouge":
            out.update(rouge(predictions, references))
        elif name == "bleu":
            out["bleu"] = bleu(predictions, references)
        elif name == "meteor":
            out["meteor"] = meteor(predictions, references, wordnet=kwargs.get("wordnet"))
        elif ":" in name:
            value = user_metric(name)(predictions, references)
            if isinstance(value, dict):
                out.update({str(k): float(v) for k, v in value.items()})
            else:
                out[name.rpartition(":")[2]] = float(value)
        else:
            raise ValueError(f"unknown metric {name!r}")
    return out
