"""Scoring rules for `loglikelihood(context, continuation)` with a masked LM.

| rule      | forward passes (n = continuation tokens) | what is scored |
|-----------|------------------------------------------|----------------|
| `beam`    | <= n * beam (n at beam = 1)              | best reveal order of the gold tokens (reference rule, default) |
| `oneshot` | 1                                        | all slots masked at once |
| `pll`     | n                                        | each slot masked alone, the rest revealed |
| `l2r`     | n                                        | left to right, future slots masked |
| `elbo`    | <= samples (1 at n = 1)                  | stratified Monte-Carlo ELBO, k of n masked weighted by n/k (LLaDA) |
"""
from __future__ import annotations

from .base import Query, QueryStats, RequestScoring, ScoreRequest, ScoreResult, ScoringRule
from .beam import BeamRule
from .elbo import ElboRule
from .l2r import LeftToRightRule
from .oneshot import OneShotRule
from .pll import PseudoLogLikelihoodRule

RULES: dict[str, type[ScoringRule]] = {
    "beam": BeamRule,
    "oneshot": OneShotRule,
    "pll": PseudoLogLikelihoodRule,
    "l2r": LeftToRightRule,
    "elbo": ElboRule,
}


def make_rule(name: str, mask_id: int, beam: int = 1, *, samples: int = 128,
              seed: int = 0) -> ScoringRule:
    """The rule called `name`; `beam` only applies to the beam rule, `samples` and `seed`
    (Monte-Carlo draws per request) to the elbo rule."""
    if name not in RULES:
        raise ValueError(f"unknown scoring rule {name!r}; choose one of {', '.join(RULES)}")
    if name == "beam":
        return BeamRule(mask_id=mask_id, beam=int(beam))
    if name == "elbo":
        return ElboRule(mask_id=mask_id, samples=int(samples), seed=int(seed))
    return RULES[name](mask_id=mask_id)


__all__ = ["RULES", "make_rule", "BeamRule", "ElboRule", "LeftToRightRule", "OneShotRule",
           "PseudoLogLikelihoodRule", "Query", "QueryStats", "RequestScoring", "ScoreRequest",
           "ScoreResult", "ScoringRule"]
