"""Shared types of the scoring rules.

A rule turns one request `(prefix, continuation)` into rounds of queries. A query is one
forward pass over `prefix + suffix`, where the suffix is the continuation with some slots
replaced by [MASK] (plus an optional tail such as EOS). The engine batches the queries of many
requests, runs the model and hands back, per asked position, the log-prob of the gold token and
the argmax token: that is all any rule needs, and it keeps the vocabulary-sized logits out of
the rules. Rules are pure: same stats in, same score out, whatever model or batching produced
the stats.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ScoreRequest:
    """`prefix` is `[BOS] + context` token ids (already truncated to fit), `continuation` the
    ids to score, `tail` ids that follow the continuation slots unscored (e.g. `(EOS,)`)."""

    prefix: tuple[int, ...]
    continuation: tuple[int, ...]
    tail: tuple[int, ...] = ()

    def __post_init__(self):
        if not self.prefix:
            raise ValueError("a score request needs a non-empty prefix (at least [BOS])")


@dataclass(frozen=True)
class Query:
    """One forward pass: the suffix ids, and the suffix positions whose stats are wanted
    with their gold tokens."""

    suffix: tuple[int, ...]
    positions: tuple[int, ...]
    targets: tuple[int, ...]


@dataclass(frozen=True)
class QueryStats:
    """Per asked position: log p(gold), the argmax token and its log-prob."""

    gold_logprob: tuple[float, ...]
    argmax: tuple[int, ...]
    max_logprob: tuple[float, ...]


@dataclass
class ScoreResult:
    """`logprob` of the continuation, `is_greedy` (does the rule's argmax fill reproduce it?)
    and `passes`, the forward passes (rows) this request cost."""

    logprob: float
    is_greedy: bool
    passes: int = 0


class RequestScoring(ABC):
    """The state of one request under a rule: asks queries round by round until done."""

    def __init__(self, request: ScoreRequest, mask_id: int):
        self.request = request
        self.mask_id = mask_id
        self.passes = 0
        self.result: ScoreResult | None = None

    @property
    def done(self) -> bool:
        return self.result is not None

    @abstractmethod
    def pending(self) -> list[Query]:
        """Queries of the next round (empty when done)."""

    @abstractmethod
    def update(self, stats: list[QueryStats]) -> None:
        """Consume the stats of the queries `pending` returned, in the same order."""

    def _finish(self, logprob: float, is_greedy: bool) -> None:
        self.result = ScoreResult(float(logprob), bool(is_greedy), self.passes)

    def masked_query(self, revealed) -> Query:
        """The continuation with every slot outside `revealed` masked; asks for the masked
        slots (the ones a rule scores next)."""
        cont = self.request.continuation
        suffix = tuple(tok if j in revealed else self.mask_id for j, tok in enumerate(cont))
        asked = tuple(j for j in range(len(cont)) if j not in revealed)
        return Query(suffix + self.request.tail, asked, tuple(cont[j] for j in asked))


class OneSlotPerQuery(RequestScoring):
    """Rules whose queries each score one slot (slot i in the i-th query) and depend only on
    gold tokens, so all n run in one round: the score is the sum, and the argmax fill
    reproduces the continuation iff every slot's argmax is gold."""

    def __init__(self, request: ScoreRequest, mask_id: int):
        super().__init__(request, mask_id)
        if not request.continuation:
            self._finish(0.0, True)

    def update(self, stats: list[QueryStats]) -> None:
        self.passes += len(stats)
        gold = self.request.continuation
        total = sum(st.gold_logprob[0] for st in stats)
        self._finish(total, all(st.argmax[0] == gold[i] for i, st in enumerate(stats)))


@dataclass(frozen=True)
class ScoringRule(ABC):
    """A named way to score `log p(continuation | context)` with a masked LM."""

    mask_id: int
    name: str = field(init=False, default="")

    @abstractmethod
    def start(self, request: ScoreRequest) -> RequestScoring:
        """A fresh per-request state."""

    @abstractmethod
    def max_passes(self, n: int) -> int:
        """Upper bound of forward passes for a continuation of n tokens (the documented cost)."""
