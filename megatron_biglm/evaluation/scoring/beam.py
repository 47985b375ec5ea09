"""`beam`: the reference code's zero-shot rule ("max_beam_based"); the default.

Input `[BOS] + context + [MASK]*n`, context rows see only the context (split = prefix length).
Each round, every beam candidate (a set of revealed slots) is run once; its children reveal
the gold token at one of its still-masked slots, the `beam` slots with the highest p(gold)
first. The `beam` best children by cumulative log p(gold) survive. After n rounds the score
is the best cumulative log-prob: the log of the best product of p(gold) over reveal orders
the search visits.

Cost: sum_k min(beam, C(n, k)) <= n * beam forward passes (n with beam = 1, where it is the
greedy reveal order: always reveal the slot whose gold token is most probable).

Differences from the reference implementation (identical at beam = 1, its published setting):
children that reach the same revealed set by different orders are merged, keeping the best
score (their futures are identical, so this only frees beam slots); ties go to the lower slot.

is_greedy: confidence-ordered greedy decoding -- fill the masked slot whose argmax is most
probable with that argmax, repeat -- reproduces the continuation. It is checked along its own
path; with beam = 1 that path is the beam's, with beam > 1 it costs extra passes only while
the path is outside the beam, and it stops at the first wrong argmax.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import comb

from .base import QueryStats, RequestScoring, ScoreRequest, ScoringRule

Revealed = frozenset


class _Beam(RequestScoring):
    def __init__(self, request: ScoreRequest, mask_id: int, beam: int):
        super().__init__(request, mask_id)
        self.beam = beam
        self.n = len(request.continuation)
        self.candidates: list[tuple[Revealed, float]] = [(Revealed(), 0.0)]
        self.greedy_path: Revealed | None = Revealed()  # None once the greedy check is settled
        self.greedy_ok = True
        self._asked: list[Revealed] = []
        if self.n == 0:
            self._finish(0.0, True)

    def pending(self):
        if self.done:
            return []
        asked = [state for state, _ in self.candidates]
        if self.greedy_path is not None and self.greedy_path not in asked:
            asked.append(self.greedy_path)
        self._asked = asked
        return [self.masked_query(state) for state in asked]

    def update(self, stats: list[QueryStats]) -> None:
        self.passes += len(stats)
        by_state = dict(zip(self._asked, stats))
        self._advance_beam(by_state)
        self._advance_greedy(by_state)
        if len(self.candidates[0][0]) == self.n:
            self._finish(self.candidates[0][1], self.greedy_ok)

    def _advance_beam(self, by_state: dict[Revealed, QueryStats]) -> None:
        children: dict[Revealed, float] = {}
        for state, score in self.candidates:
            st = by_state[state]
            masked = self.masked_query(state).positions
            order = sorted(range(len(masked)), key=lambda i: (-st.gold_logprob[i], masked[i]))
            for i in order[: self.beam]:
                child = state | {masked[i]}
                child_score = score + st.gold_logprob[i]
                if child not in children or child_score > children[child]:
                    children[child] = child_score
        ranked = sorted(children.items(), key=lambda kv: -kv[1])  # stable: ties keep order
        self.candidates = ranked[: self.beam]

    def _advance_greedy(self, by_state: dict[Revealed, QueryStats]) -> None:
        if self.greedy_path is None:
            return
        st = by_state[self.greedy_path]
        masked = self.masked_query(self.greedy_path).positions
        best = max(range(len(masked)), key=lambda i: (st.max_logprob[i], -masked[i]))
        if st.argmax[best] != self.request.continuation[masked[best]]:
            self.greedy_ok, self.greedy_path = False, None
            return
        self.greedy_path = self.greedy_path | {masked[best]}
        if len(self.greedy_path) == self.n:
            self.greedy_path = None


@dataclass(frozen=True)
class BeamRule(ScoringRule):
    beam: int = 1
    name: str = field(init=False, default="beam")

    def __post_init__(self):
        if int(self.beam) < 1:
            raise ValueError(f"beam must be >= 1, got {self.beam}")

    def start(self, request: ScoreRequest) -> RequestScoring:
        return _Beam(request, self.mask_id, int(self.beam))

    def max_passes(self, n: int) -> int:
        """Beam passes only; the greedy check of beam > 1 may add up to n more."""
        return sum(min(self.beam, comb(n, k)) for k in range(n))
