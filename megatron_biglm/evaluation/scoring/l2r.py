"""`l2r`: left to right, future continuation tokens masked.

score = sum_i log p(c_i | prefix, c_<i, [MASK]*(n-i)): the masked-LM analogue of causal
scoring. Cost: n forward passes; they only depend on gold tokens, so they run in one round.
is_greedy: left-to-right greedy decoding (one token per step, argmax) reproduces the
continuation, i.e. every step's argmax is gold.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .base import Query, QueryStats, RequestScoring, ScoringRule, ScoreRequest


class _LeftToRight(RequestScoring):
    def __init__(self, request: ScoreRequest, mask_id: int):
        super().__init__(request, mask_id)
        if not request.continuation:
            self._finish(0.0, True)

    def pending(self) -> list[Query]:
        if self.done:
            return []
        queries = []
        for i in range(len(self.request.continuation)):
            q = self.masked_query(frozenset(range(i)))
            queries.append(Query(q.suffix, q.positions[:1], q.targets[:1]))  # only slot i
        return queries

    def update(self, stats: list[QueryStats]) -> None:
        self.passes += len(stats)
        gold = self.request.continuation
        total = sum(st.gold_logprob[0] for st in stats)
        greedy = all(st.argmax[0] == gold[i] for i, st in enumerate(stats))
        self._finish(total, greedy)


@dataclass(frozen=True)
class LeftToRightRule(ScoringRule):
    name: str = field(init=False, default="l2r")

    def start(self, request: ScoreRequest) -> RequestScoring:
        return _LeftToRight(request, self.mask_id)

    def max_passes(self, n: int) -> int:
        return n
