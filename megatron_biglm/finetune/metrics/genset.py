"""Genset metrics (paper Table 5): BLEU-2 and Distinct-2 of generated text.

  * BLEU-2: `sacrebleu` corpus BLEU with max n-gram order 2 (13a tokenisation, exp
    smoothing; `generation.bleu`), as a fraction in [0, 1].
  * Distinct-2 (Li et al., 2016): distinct bigrams / all bigrams over the whole set of
    generations (corpus level), on lowercased whitespace tokens; a text of one token adds
    no bigram. 0 when there is no bigram at all.
"""
from __future__ import annotations

from typing import Sequence

from .generation import Reference, bleu


def distinct_n(texts: Sequence[str], n: int = 2) -> float:
    grams = [tuple(tokens[i:i + n]) for tokens in (t.lower().split() for t in texts)
             for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def genset_scores(predictions: Sequence[str], references: Sequence[Reference]) -> dict:
    """{"bleu2", "distinct2"} of one Genset data set (WIKI-AUTO, QQP, PersonaChat, ...)."""
    return {"bleu2": bleu(predictions, references, max_order=2), "distinct2": distinct_n(predictions, 2)}
