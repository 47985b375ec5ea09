"""`elbo`: a stratified Monte-Carlo ELBO of the continuation (LLaDA's likelihood estimator).

Why: masked-diffusion LMs (LLaDA, Dream) are scored in lm-eval with this bound, so BiGLM scored
the same way sits on the same footing. For a continuation of n tokens, sample s draws k masked
slots (k in 1..n) at random positions S, and score

    elbo = mean over samples of  (n / k) * sum_{j in S} log p(c_j | prefix, c outside S)

i.e. the masked-token log-likelihood weighted by 1 / p_mask with p_mask = k / n. Stratified over
k as LLaDA does: k_0 is uniform in 1..n and k_i = round(k_0 + i n / s) wrapped into 1..n, so
every k is covered evenly while each k_i stays marginally uniform; the estimator is then
unbiased for

    E = (1/n) sum_{k=1..n} (n/k) mean_{|S|=k} sum_{j in S} log p(c_j | c outside S),

a lower bound of log p(continuation | context) for a model trained with that masking. With n = 1
it is the one exact value (k = 1: log p(c_0 | prefix, [MASK])) and one pass.

Cost: at most s forward passes (identical masked sets are run once; a request with n = 1 runs
one). Draws are seeded from (seed, the request's ids), so a score never depends on batching or
on the other requests. Runs through the engine like every rule, so prefix reuse applies.
is_greedy: every sampled masked slot's argmax is the gold token (a check on the draws seen).
"""
from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from dataclasses import dataclass, field

from .base import QueryStats, RequestScoring, ScoreRequest, ScoringRule


def stratified_mask_counts(n: int, samples: int, rng: random.Random) -> list[int]:
    """k_i in 1..n for i < samples: a uniform start, then spaced n / samples apart (wrapped).

    Rounded half up, not half to even (`round`, `torch.round` as in LLaDA's code): with an
    integer k_0, half-to-even would map k_0 + 0.5 to the even neighbour, making k_i's marginal
    non-uniform and the estimator biased; half up shifts every k_0 by the same amount."""
    k0 = rng.randint(1, n)
    return [((math.floor(k0 + i * n / samples + 0.5) - 1) % n) + 1 for i in range(samples)]


class _Elbo(RequestScoring):
    def __init__(self, request: ScoreRequest, mask_id: int, samples: int, seed: int):
        super().__init__(request, mask_id)
        self.n = len(request.continuation)
        if self.n == 0:
            self._finish(0.0, True)
            return
        key = f"{seed}|{request.prefix}|{request.continuation}|{request.tail}".encode()
        rng = random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))
        draws = 1 if self.n == 1 else samples
        masked = [frozenset(rng.sample(range(self.n), k))
                  for k in stratified_mask_counts(self.n, draws, rng)]
        self.counts = Counter(masked)
        self.draws = draws
        self._asked = list(self.counts)

    def pending(self):
        if self.done:
            return []
        return [self.masked_query(frozenset(range(self.n)) - s) for s in self._asked]

    def update(self, stats: list[QueryStats]) -> None:
        self.passes += len(stats)
        gold = self.request.continuation
        total, greedy = 0.0, True
        for s, st in zip(self._asked, stats):
            # masked_query asks the masked slots in increasing order
            total += self.counts[s] * (self.n / len(s)) * sum(st.gold_logprob)
            greedy &= all(a == gold[j] for a, j in zip(st.argmax, sorted(s)))
        self._finish(total / self.draws, greedy)


@dataclass(frozen=True)
class ElboRule(ScoringRule):
    samples: int = 128
    seed: int = 0
    name: str = field(init=False, default="elbo")

    def __post_init__(self):
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise ValueError(f"elbo samples must be a positive integer, got {self.samples!r}")

    def start(self, request: ScoreRequest) -> RequestScoring:
        return _Elbo(request, self.mask_id, self.samples, self.seed)

    def max_passes(self, n: int) -> int:
        return 0 if n == 0 else (1 if n == 1 else self.samples)
