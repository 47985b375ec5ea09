"""Task descriptions and declarations. How a task is modelled (encoders, loss, evaluation) is
its kind's (`finetune/kinds/`, one module each); a task reads its kind's class, and the helpers
kinds share (SQuAD windows and answers, template fitting, declared columns) sit in `finetune/`
itself, so `kinds/` never reads this package.

| concept | module |
|---|---|
| `Task` (name, data set, kind, fields, metrics) | `task` |
| a task declared as data (`finetune.task: {kind: ..., fields: ...}`) | `declaration` |
| the built-in tasks (MNLI, SuperGLUE x5, SQuAD, XSUM, MSQG) as declarations, and prompts | `prompts` |
| (re-exported) SQuAD windows / offsets, n-best answers | `finetune/squad_windows`, `finetune/squad_answers` |
"""
from ..squad_answers import SpanCandidate, nbest_spans, squad_predictions
from ..squad_windows import NO_ANSWER_POSITION, SquadEncoder, SquadWindow, window_bounds
from .task import Task
from .prompts import DECLARATIONS, PROMPTS, TASKS, get_task


__all__ = ["DECLARATIONS", "NO_ANSWER_POSITION", "PROMPTS", "SpanCandidate", "SquadEncoder", "SquadWindow",
           "TASKS", "Task", "get_task", "nbest_spans", "squad_predictions", "window_bounds"]
