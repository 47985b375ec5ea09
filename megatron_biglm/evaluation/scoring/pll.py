"""`pll`: pseudo-log-likelihood, one masked continuation token at a time.

score = sum_i log p(c_i | prefix, c_{-i}) (Salazar et al., 2020, restricted to the
continuation: the context is given, as in lm-eval's loglikelihood). Cost: n forward passes,
all independent, so they run in one round. is_greedy: every masked slot's argmax is gold.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .base import OneSlotPerQuery, Query, RequestScoring, ScoreRequest, ScoringRule


class _PseudoLogLikelihood(OneSlotPerQuery):
    def pending(self) -> list[Query]:
        if self.done:
            return []
        n = len(self.request.continuation)
        return [self.masked_query(frozenset(range(n)) - {i}) for i in range(n)]


@dataclass(frozen=True)
class PseudoLogLikelihoodRule(ScoringRule):
    name: str = field(init=False, default="pll")

    def start(self, request: ScoreRequest) -> RequestScoring:
        return _PseudoLogLikelihood(request, self.mask_id)

    def max_passes(self, n: int) -> int:
        return n
