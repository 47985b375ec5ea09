"""Generation metrics: ROUGE (`rouge-score`), BLEU (`sacrebleu`), METEOR (nltk + WordNet).

Conventions (stated because papers differ):
  * ROUGE-1/2/L: `rouge_score.RougeScorer` with `use_stemmer=True` (Porter stemming, as
    commonly reported for XSUM), F-measure per example, mean over examples. rougeL is the
    sentence-level LCS (not rougeLsum).
  * BLEU: `sacrebleu.corpus_bleu` (corpus BLEU, 13a tokenisation, exp smoothing, which only
    acts when some n-gram order has no match), `max_order=4` for BLEU-4, 2 for BLEU-2.
  * METEOR: `nltk.translate.meteor_score` per example (whitespace tokens, lowercased,
    alpha=0.9, beta=3, gamma=0.5: nltk's defaults), mean over examples. It needs WordNet:
    see `megatron_biglm.finetune.metrics.wordnet`.
Each reference argument is one reference per prediction (a string) or several (a list).
"""
from __future__ import annotations

from typing import Sequence, Union

from .wordnet import wordnet_reader

Reference = Union[str, Sequence[str]]


def _as_lists(predictions: Sequence[str], references: Sequence[Reference]) -> list[list[str]]:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not predictions:
        raise ValueError("no examples to score")
    out = [[r] if isinstance(r, str) else list(r) for r in references]
    if any(not refs for refs in out):
        raise ValueError("every prediction needs at least one reference")
    return out


def rouge(predictions: Sequence[str], references: Sequence[Reference],
          types: Sequence[str] = ("rouge1", "rouge2", "rougeL"), use_stemmer: bool = True) -> dict:
    """Mean F-measure per ROUGE type; with several references an example takes the best."""
    from rouge_score import rouge_scorer  # lazy: optional (eval extra)

    refs = _as_lists(predictions, references)
    scorer = rouge_scorer.RougeScorer(list(types), use_stemmer=use_stemmer)
    totals = dict.fromkeys(types, 0.0)
    for pred, golds in zip(predictions, refs):
        for t in types:
            totals[t] += max(scorer.score(g, pred)[t].fmeasure for g in golds)
    return {t: totals[t] / len(predictions) for t in types}


def bleu(predictions: Sequence[str], references: Sequence[Reference], max_order: int = 4) -> float:
    """Corpus BLEU in [0, 1] (sacrebleu's score / 100). Examples may have different numbers
    of references (sacrebleu pads the missing streams with None)."""
    from sacrebleu.metrics import BLEU  # lazy: optional (eval extra)

    refs = _as_lists(predictions, references)
    width = max(len(r) for r in refs)
    streams = [[r[i] if i < len(r) else None for r in refs] for i in range(width)]
    return BLEU(max_ngram_order=max_order).corpus_score(list(predictions), streams).score / 100.0


def meteor(predictions: Sequence[str], references: Sequence[Reference], *, wordnet=None) -> float:
    """Mean sentence METEOR. `wordnet` defaults to `wordnet.wordnet_reader()`, which
    raises WordNetUnavailable (naming the apt-get fix) when no WordNet exists."""
    from nltk.translate.meteor_score import meteor_score  # lazy: optional (eval extra)

    refs = _as_lists(predictions, references)
    if wordnet is None:
        wordnet = wordnet_reader()
    total = sum(meteor_score([g.split() for g in golds], pred.split(), wordnet=wordnet)
                for pred, golds in zip(predictions, refs))
    return total / len(predictions)


# ---------------------------------------------------------------- Genset (paper Table 5)
# BLEU-2 (`bleu` with max n-gram order 2, as a fraction in [0, 1]) and Distinct-2 (Li et al.,
# 2016): distinct bigrams / all bigrams over the whole set of generations (corpus level), on
# lowercased whitespace tokens; a text of one token adds no bigram; 0 when there is no bigram.
def distinct_n(texts: Sequence[str], n: int = 2) -> float:
    grams = [tuple(tokens[i:i + n]) for tokens in (t.lower().split() for t in texts)
             for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def genset_scores(predictions: Sequence[str], references: Sequence[Reference]) -> dict:
    """{"bleu2", "distinct2"} of one Genset data set (WIKI-AUTO, QQP, PersonaChat, ...)."""
    return {"bleu2": bleu(predictions, references, max_order=2), "distinct2": distinct_n(predictions, 2)}
