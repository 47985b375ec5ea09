"""`l2r`: left to right, future continuation tokens masked.

score = sum_i log p(c_i | prefix, c_<i, [MASK]*(n-i)): the masked-LM analogue of causal
scoring. Cost: n forward passes; they only depend on gold tokens, so they run in one round.
is_greedy: left-to-right greedy decoding (one token per step, argmax) reproduces the
continuation, i.e. every step's argmax is gold.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .base import OneSlotPerQuery, Query, RequestScoring, ScoreRequest, ScoringRule


class _LeftToRight(OneSlotPerQuery):
    def pending(self) -> list[Query]:
        if self.done:
            return []
        queries = []
        for i in range(len(self.request.continuation)):
            q = self.masked_query(frozenset(range(i)))
            queries.append(Query(q.suffix, q.positions[:1], q.targets[:1]))  # only slot i
        return queries


@dataclass(frozen=True)
class LeftToRightRule(ScoringRule):
    name: str = field(init=False, default="l2r")

    def start(self, request: ScoreRequest) -> RequestScoring:
        return _LeftToRight(request, self.mask_id)

    def max_passes(self, n: int) -> int:
        return n
