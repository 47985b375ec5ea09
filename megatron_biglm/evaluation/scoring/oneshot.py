"""`oneshot`: all continuation tokens masked at once, scored in one pass.

score = sum_i log p(c_i | prefix, [MASK]*n). Cost: 1 forward pass. is_greedy: the argmax at
every slot of that single pass is the gold token (one-step parallel decoding reproduces it).
Cheapest rule; ignores dependencies between continuation tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .base import QueryStats, RequestScoring, ScoreRequest, ScoringRule


class _OneShot(RequestScoring):
    def __init__(self, request: ScoreRequest, mask_id: int):
        super().__init__(request, mask_id)
        if not request.continuation:
            self._finish(0.0, True)

    def pending(self):
        return [] if self.done else [self.masked_query(frozenset())]

    def update(self, stats: list[QueryStats]) -> None:
        (st,) = stats
        self.passes += 1
        gold = self.request.continuation
        self._finish(sum(st.gold_logprob), all(a == g for a, g in zip(st.argmax, gold)))


@dataclass(frozen=True)
class OneShotRule(ScoringRule):
    name: str = field(init=False, default="oneshot")

    def start(self, request: ScoreRequest) -> RequestScoring:
        return _OneShot(request, self.mask_id)

    def max_passes(self, n: int) -> int:
        return 1 if n else 0
