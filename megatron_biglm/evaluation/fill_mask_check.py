"""Fill-mask on held-out lines: does the model put a fitting word where one was removed?

Each example is a line of running text with one word replaced by the mask token. The word is
one the tokenizer stores as a single token *with its leading space* (byte-level BPE: " king"),
and the mask takes the place of that token, space included (`"the<mask> is dead"`): written
with a space before the mask, the model would be asked for a word that follows a bare space
token, which the training data never has, and it answers with punctuation.

The report gives top-1 / top-k accuracy against the removed word, the share of top-1 answers
that are words at all, and the best accuracy a context-free guess could reach on the same
examples (always answering the most common removed word), so the numbers read on their own.
"""
from __future__ import annotations

import random
import re
from collections import Counter
from typing import Iterable, Sequence

_WORD = re.compile(r"(?<![\w'])([A-Za-z]{3,})(?![\w'])")


def single_token_word(tokenizer, word: str) -> bool:
    """Whether " word" is one token of `tokenizer` (so one mask stands for the whole word)."""
    return len(tokenizer(" " + word, add_special_tokens=False)["input_ids"]) == 1


def masked_word_examples(lines: Iterable[str], tokenizer, n: int, *, seed: int = 0) -> list[dict]:
    """Up to `n` {"text", "answer", "line"}: one single-token word (not the line's first) masked
    per line, lines and words drawn with `seed`."""
    lines = list(lines)
    rng = random.Random(seed)
    rng.shuffle(lines)
    mask = tokenizer.mask_token
    examples = []
    for line in lines:
        candidates = [m for m in _WORD.finditer(line) if m.start() > 0 and line[m.start() - 1] == " "
                      and single_token_word(tokenizer, m.group(1))]
        if not candidates:
            continue
        m = rng.choice(candidates)
        text = line[:m.start() - 1] + mask + line[m.end():]
        examples.append({"text": text, "answer": m.group(1), "line": line})
        if len(examples) == n:
            break
    return examples


def fill_mask_report(fill, examples: Sequence[dict], top_k: int = 3, show: int = 5) -> dict:
    """Run a transformers fill-mask pipeline `fill` on the examples and score it."""
    top1 = topk = words = 0
    shown = []
    for ex in examples:
        predictions = fill(ex["text"], top_k=top_k)
        tokens = [p["token_str"].strip() for p in predictions]
        top1 += tokens[0] == ex["answer"]
        topk += ex["answer"] in tokens
        words += tokens[0].isalpha()
        if len(shown) < show:
            shown.append({"text": ex["text"], "answer": ex["answer"],
                          "top": [{"token": p["token_str"], "score": round(p["score"], 4)} for p in predictions]})
    n = len(examples)
    if not n:
        raise ValueError("no fill-mask examples (no line holds a single-token word)")
    common = Counter(ex["answer"] for ex in examples).most_common(1)[0]
    return {"examples": n, "top1_accuracy": round(top1 / n, 4), f"top{top_k}_accuracy": round(topk / n, 4),
            "top1_is_a_word": round(words / n, 4),
            "context_free_best": {"word": common[0], "accuracy": round(common[1] / n, 4)},
            "shown": shown}
