"""The task kinds: how a task is modelled, one module each, and the registry that names them.

A kind is one `FinetuneRecipe` subclass (`base.py`) in one module; it must write the methods of
`protocol.TaskKind` (encode, collate, _loss, evaluate_split), the rest are hooks with defaults:
its typed `Options`
(`finetune.options`), how it reads a declaration (`declaration_keys`, `problem_types`,
`default_metrics`, `declared_schema`, `declare`, `check_task`), how it encodes rows and
collates them, its loss, its evaluation, and whether it can score a model zero-shot
(`scores_zero_shot`). Built as `KindClass(task, tokenizer, options)` (`options`: the run
config's `finetune:` section).

`KINDS` maps a kind's name to `module:Class`, imported only when a run uses it. A new kind is
one file and one line here, or, without touching the package, `register_kind(name,
"module:Class")`; a task declaration may also name the class itself (`kind: my_pkg.kinds:Mine`).
"""
from __future__ import annotations

import importlib

from .base import FinetuneRecipe
from .protocol import REQUIRED, TaskKind, unwritten
from megatron_biglm.common.config_fields import did_you_mean

KINDS: dict[str, str] = {
    "verbalizer": "megatron_biglm.finetune.kinds.verbalizer:VerbalizerRecipe",
    "head": "megatron_biglm.finetune.kinds.head:HeadClassificationRecipe",
    "span": "megatron_biglm.finetune.kinds.span:SpanQARecipe",
    "seq2seq": "megatron_biglm.finetune.kinds.seq2seq:Seq2SeqRecipe",
    "contrastive": "megatron_biglm.finetune.kinds.contrastive:ContrastiveRecipe",
    "instruct": "megatron_biglm.finetune.kinds.instruct:InstructRecipe",
}


def register_kind(name: str, target) -> None:
    """Make `name` a task kind: `target` is its class, or `"module:Class"` (imported when used)."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"a kind's name is a plain word (no ':'), got {name!r}")
    KINDS[name] = target


def kind_class(kind: str) -> type:
    """The class of a registered kind, or of a `module:Class` a declaration names; an unknown
    kind is a ValueError naming the registered ones (and the nearest)."""
    target = KINDS.get(kind)
    if target is None:
        if not (isinstance(kind, str) and kind.count(":") == 1):
            raise ValueError(f"unknown task kind {kind!r}{did_you_mean([str(kind)], list(KINDS))}; the kinds are "
                             f"{', '.join(KINDS)}, or a 'module:Class' of your own")
        target = kind
    if isinstance(target, str):
        module_name, _, attr = target.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"task kind {kind!r}: cannot import {target!r} ({exc})") from None
    else:
        cls = target
    if not (isinstance(cls, type) and issubclass(cls, FinetuneRecipe)):
        raise ValueError(f"task kind {kind!r}: {target!r} is not a FinetuneRecipe subclass "
                         "(megatron_biglm.finetune.kinds.base)")
    missing = unwritten(cls, FinetuneRecipe)
    if missing:
        raise ValueError(f"task kind {kind!r}: {target!r} does not write {', '.join(missing)}; a kind writes "
                         f"the methods of kinds.protocol.TaskKind ({', '.join(REQUIRED)})")
    return cls


def recipe_for(task, tokenizer, options):
    """The kind's recipe for `task`, constructed as `KindClass(task, tokenizer, options)`."""
    return kind_class(task.kind)(task, tokenizer, options)


__all__ = ["KINDS", "TaskKind", "kind_class", "recipe_for", "register_kind"]
