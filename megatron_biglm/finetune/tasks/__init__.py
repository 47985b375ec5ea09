"""Task-side building blocks of fine-tuning: task descriptions, declarations and the helpers
more than one kind uses. How a task is modelled (encoders, loss, evaluation) is its kind's
(`finetune/kinds/`, one module each).

| concept | module |
|---|---|
| `Task` (name, data set, kind, fields, metrics) | `task` |
| a task declared as data (`finetune.task: {kind: ..., fields: ...}`) | `declaration` |
| the built-in tasks (MNLI, SuperGLUE x5, SQuAD, XSUM, MSQG) as declarations, and prompts | `prompts` |
| SQuAD windows / offsets, n-best answers | `squad_windows`, `squad_answers` |
| the columns of a labelled task as declared, the declaration error | `columns` |
| fill a template and cut the longest field | `text_fit` |

The built-in tasks are declarations, read by their kinds' classes, so `TASKS`, `DECLARATIONS`,
`PROMPTS` and `get_task` are loaded on first use: a kind's module may import this package's
helpers without loading every kind first.
"""
from .squad_answers import SpanCandidate, nbest_spans, squad_predictions
from .squad_windows import NO_ANSWER_POSITION, SquadEncoder, SquadWindow, window_bounds
from .task import Task

_FROM_PROMPTS = ("DECLARATIONS", "PROMPTS", "TASKS", "get_task")


def __getattr__(name: str):
    if name in _FROM_PROMPTS:
        from . import prompts

        return getattr(prompts, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DECLARATIONS", "NO_ANSWER_POSITION", "PROMPTS", "SpanCandidate", "SquadEncoder", "SquadWindow",
           "TASKS", "Task", "get_task", "nbest_spans", "squad_predictions", "window_bounds"]
