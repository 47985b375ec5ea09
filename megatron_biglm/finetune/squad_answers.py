"""SQuAD answer selection: the n-best spans over all windows of a question.

For each window, the `n_best` highest start logits and end logits are paired; a pair is a
candidate when both positions are context tokens (offset not None), end >= start, and the
span is at most `max_answer_length` tokens. Its score is start_logit + end_logit. Candidates
of all windows of the question are pooled, the same character span (seen from two
overlapping windows) kept once with its best score, and ranked; the answer is the context
text between the start token's first and the end token's last character. A question with
no valid candidate gets "". (BERT's "max context" preference between overlapping windows is
not applied; HF's `run_qa` does not apply it either.)
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping, Sequence

from .squad_windows import SquadWindow


@dataclass(frozen=True)
class SpanCandidate:
    text: str
    score: float
    start_char: int
    end_char: int
    window_index: int


def _top(values: Sequence[float], n: int) -> list[int]:
    return sorted(range(len(values)), key=lambda i: (-values[i], i))[:n]


def nbest_spans(context: str, windows: Sequence[SquadWindow], start_logits: Sequence[Sequence[float]],
                end_logits: Sequence[Sequence[float]], *, n_best: int = 20,
                max_answer_length: int = 30) -> list[SpanCandidate]:
    """Ranked candidates (best first, at most n_best) for one question. `start_logits[w]` /
    `end_logits[w]` are window w's logits over its input positions (padding beyond
    `windows[w].length` is ignored)."""
    best: dict[tuple[int, int], SpanCandidate] = {}
    for window, starts, ends in zip(windows, start_logits, end_logits):
        starts = [float(x) for x in list(starts)[:window.length]]
        ends = [float(x) for x in list(ends)[:window.length]]
        for s in _top(starts, n_best):
            for e in _top(ends, n_best):
                if window.offsets[s] is None or window.offsets[e] is None:
                    continue
                if e < s or e - s + 1 > max_answer_length:
                    continue
                start_char, end_char = window.offsets[s][0], window.offsets[e][1]
                score = starts[s] + ends[e]
                key = (start_char, end_char)
                if key not in best or score > best[key].score:
                    best[key] = SpanCandidate(context[start_char:end_char], score, start_char,
                                              end_char, window.window_index)
    ranked = sorted(best.values(), key=lambda c: (-c.score, c.start_char, c.end_char))
    return ranked[:n_best]


def squad_predictions(contexts: Mapping[str, str], windows: Sequence[SquadWindow],
                      start_logits: Sequence[Sequence[float]], end_logits: Sequence[Sequence[float]],
                      *, n_best: int = 20, max_answer_length: int = 30) -> dict[str, str]:
    """example id -> predicted answer text, for the windows of many questions in any order
    (`start_logits[i]` belongs to `windows[i]`). Feed it to `metrics.squad_scores`."""
    grouped: dict[str, list[int]] = defaultdict(list)
    for i, window in enumerate(windows):
        grouped[window.example_id].append(i)
    predictions = {}
    for example_id, indices in grouped.items():
        spans = nbest_spans(contexts[example_id], [windows[i] for i in indices],
                            [start_logits[i] for i in indices], [end_logits[i] for i in indices],
                            n_best=n_best, max_answer_length=max_answer_length)
        predictions[example_id] = spans[0].text.strip() if spans else ""
    return predictions
