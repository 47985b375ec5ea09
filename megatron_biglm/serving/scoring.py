"""Per-token log-probabilities of a prompt under a named scoring rule, for `echo` + `logprobs`.

A prompt of token ids is split where its context ends (`context_tokens`, the documented request
field): `[BOS] + ids[:context_tokens]` is the prefix, the rest the continuation that the rule
(`evaluation.scoring`: beam, oneshot, pll, l2r, elbo) scores, run by the same engine as the
in-process lm-eval backend (`evaluation.runner.score_requests`), so both give the same numbers.
With `context_tokens = 0` the whole prompt is scored after `[BOS]` (what lm-eval's
`local-completions` needs for `pll`: it sends no split and reads the continuation's entries).

Where a rule's score is a sum of one term per continuation token (pll, l2r, oneshot, beam at
width 1), the term of token j is the last log-probability the rule asked for at slot j, and
those terms are returned per token; otherwise only the total is known and the per-token entries
of the continuation are None. Context tokens are never scored (None).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from megatron_biglm.evaluation.runner import score_requests
from megatron_biglm.evaluation.scoring import QueryStats, RequestScoring, ScoreRequest, ScoringRule

#: how close the per-token terms must add up to the rule's total to be reported
_SUM_TOLERANCE = 1e-6


@dataclass
class PromptScore:
    """`logprob` and `is_greedy` of the continuation under the rule; per prompt token, its term
    (`token_logprobs`) and the best token's log-probability at that query (`top_logprobs`)."""

    logprob: float
    is_greedy: bool
    token_logprobs: list[float | None]
    top_logprobs: list[float | None]
    top_ids: list[int | None]


class _Recording(RequestScoring):
    """A rule's per-request state that remembers, per continuation slot, the last stats asked."""

    def __init__(self, inner: RequestScoring):
        super().__init__(inner.request, inner.mask_id)
        self.inner = inner
        self.asked: list = []
        self.last: dict[int, tuple[float, int, float]] = {}

    @property
    def done(self) -> bool:
        return self.inner.done

    @property
    def result(self):
        return self.inner.result

    @result.setter
    def result(self, value):  # RequestScoring.__init__ sets it; the inner state owns it
        pass

    def pending(self):
        self.asked = self.inner.pending()
        return self.asked

    def update(self, stats: list[QueryStats]) -> None:
        n = len(self.request.continuation)
        for query, st in zip(self.asked, stats):
            for pos, gold, top, best in zip(query.positions, st.gold_logprob, st.argmax, st.max_logprob):
                if pos < n:
                    self.last[pos] = (gold, top, best)
        self.inner.update(stats)


@dataclass(frozen=True)
class _RecordingRule(ScoringRule):
    inner: ScoringRule | None = None
    states: dict = field(default_factory=dict)

    def start(self, request: ScoreRequest) -> RequestScoring:
        state = _Recording(self.inner.start(request))
        self.states[id(request)] = state
        return state

    def max_passes(self, n: int) -> int:
        return self.inner.max_passes(n)


def score_prompts(adapter, prompts: Sequence[Sequence[int]], context_tokens: Sequence[int],
                  rule: ScoringRule, *, batch_size: int) -> list[PromptScore]:
    """Score each prompt's ids after its first `context_tokens[i]` (see the module docstring)."""
    bos = int(adapter.special.bos_id)
    requests = [ScoreRequest((bos, *ids[:k]), tuple(ids[k:])) for ids, k in zip(prompts, context_tokens)]
    recording = _RecordingRule(mask_id=rule.mask_id, inner=rule)
    object.__setattr__(recording, "name", rule.name)  # progress and logs name the real rule
    results = score_requests(adapter, requests, recording, batch_size=batch_size,
                             prefix_reuse=bool(adapter.prefix_cache and adapter.split_attention))
    out = []
    for ids, k, request, result in zip(prompts, context_tokens, requests, results):
        last = recording.states[id(request)].last
        terms = [last.get(j) for j in range(len(request.continuation))]
        per_token = all(t is not None for t in terms) and \
            abs(sum(t[0] for t in terms) - result.logprob) <= _SUM_TOLERANCE * max(1.0, abs(result.logprob))
        none = [None] * k
        out.append(PromptScore(
            result.logprob, result.is_greedy,
            none + ([t[0] for t in terms] if per_token else [None] * len(terms)),
            none + ([t[2] for t in terms] if per_token else [None] * len(terms)),
            none + ([t[1] for t in terms] if per_token else [None] * len(terms))))
    return out
