"""Fine-tuning recipes, one per task kind (`tasks.task.KINDS`), and the registry the entry
point picks from: `recipe_for(task, tokenizer, options)` builds
`RECIPES[task.kind](task, tokenizer, options)`; `options` is the run config's `finetune:`
section (`config.finetune_section.FinetuneConfig`).

Each entry is a zero-argument loader, so a kind's module (and its dependencies) is imported
only when a run uses it. Adding a kind is one line here.
"""
from __future__ import annotations

from typing import Callable


def _verbalizer():
    from .verbalizer import VerbalizerRecipe
    return VerbalizerRecipe


def _head():
    from .classification_head import HeadClassificationRecipe
    return HeadClassificationRecipe


def _span():
    from .span_qa import SpanQARecipe
    return SpanQARecipe


def _seq2seq():
    from .seq2seq import Seq2SeqRecipe
    return Seq2SeqRecipe


def _contrastive():
    from .contrastive import ContrastiveRecipe
    return ContrastiveRecipe


def _instruct():
    from .instruct import InstructRecipe
    return InstructRecipe


RECIPES: dict[str, Callable[[], type]] = {
    "verbalizer": _verbalizer,
    "head": _head,
    "span": _span,
    "seq2seq": _seq2seq,
    "contrastive": _contrastive,
    "instruct": _instruct,
}


def recipe_class(kind: str) -> type:
    if kind not in RECIPES:
        raise ValueError(f"no fine-tuning recipe for task kind {kind!r} yet; available: {sorted(RECIPES)}")
    return RECIPES[kind]()


def recipe_for(task, tokenizer, options):
    """The recipe for `task.kind`, constructed as `RecipeClass(task, tokenizer, options)`."""
    return recipe_class(task.kind)(task, tokenizer, options)


__all__ = ["RECIPES", "recipe_class", "recipe_for"]
