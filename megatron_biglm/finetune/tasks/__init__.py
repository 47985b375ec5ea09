"""Task-side building blocks of fine-tuning: task descriptions, feature encoders (rows ->
token ids, `split`, labels) and the pure functions that score model outputs. Nothing here
runs a model: a recipe (training/recipe.py) wires these to the model and the loop.

| concept | module |
|---|---|
| `Task` (name, data set, kind, fields, metrics) | `task` |
| a task declared as data (`finetune.task: {kind: ..., fields: ...}`) | `declaration` |
| the built-in tasks (MNLI, SuperGLUE x5, SQuAD, XSUM, MSQG) as declarations, and prompts | `prompts` |
| prompted classification with a (multi-token) verbalizer | `verbalizer` |
| head classification features | `head_classification` |
| SQuAD windows / offsets, n-best answers | `squad_windows`, `squad_answers` |
| seq2seq features (source prefix, target suffix, target length) | `seq2seq` |
| fill a template and cut the longest field | `text_fit` |
| rows -> examples for any kind (what a recipe calls) | `encode` |
"""
from .encode import encode_rows, make_encoder
from .head_classification import HeadEncoder, HeadExample
from .prompts import DECLARATIONS, PROMPTS, TASKS, get_task
from .seq2seq import Seq2SeqEncoder, Seq2SeqExample
from .squad_answers import SpanCandidate, nbest_spans, squad_predictions
from .squad_windows import NO_ANSWER_POSITION, SquadEncoder, SquadWindow, window_bounds
from .task import KINDS, Task
from .verbalizer import (IGNORE_INDEX, VerbalizerEncoder, VerbalizerExample, VerbalizerPrompt,
                         label_scores, predict_labels, verbalizer_loss)

__all__ = ["DECLARATIONS", "HeadEncoder", "HeadExample", "IGNORE_INDEX", "KINDS", "NO_ANSWER_POSITION", "PROMPTS",
           "Seq2SeqEncoder", "Seq2SeqExample", "SpanCandidate", "SquadEncoder", "SquadWindow",
           "TASKS", "Task", "VerbalizerEncoder", "VerbalizerExample", "VerbalizerPrompt",
           "encode_rows", "get_task", "label_scores", "make_encoder", "nbest_spans", "predict_labels", "squad_predictions",
           "verbalizer_loss", "window_bounds"]
