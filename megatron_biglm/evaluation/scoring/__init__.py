"""Scoring rules for `loglikelihood(context, continuation)` with a masked LM.

| rule      | forward passes (n = continuation tokens) | what is scored |
|-----------|------------------------------------------|----------------|
| `beam`    | <= n * beam (n at beam = 1)              | best reveal order of the gold tokens (reference rule, default) |
| `oneshot` | 1                                        | all slots masked at once |
| `pll`     | n                                        | each slot masked alone, the rest revealed |
| `l2r`     | n                                        | left to right, future slots masked |
"""
from __future__ import annotations

from .base import Query, QueryStats, RequestScoring, ScoreRequest, ScoreResult, ScoringRule
from .beam import BeamRule
from .l2r import LeftToRightRule
from .oneshot import OneShotRule
from .pll import PseudoLogLikelihoodRule

RULES: dict[str, type[ScoringRule]] = {
    "beam": BeamRule,
    "oneshot": OneShotRule,
    "pll": PseudoLogLikelihoodRule,
    "l2r": LeftToRightRule,
}


def make_rule(name: str, mask_id: int, beam: int = 1) -> ScoringRule:
    """The rule called `name`; `beam` only applies to the beam rule."""
    if name not in RULES:
        raise ValueError(f"unknown scoring rule {name!r}; choose one of {', '.join(RULES)}")
    if name == "beam":
        return BeamRule(mask_id=mask_id, beam=int(beam))
    return RULES[name](mask_id=mask_id)


__all__ = ["RULES", "make_rule", "BeamRule", "LeftToRightRule", "OneShotRule",
           "PseudoLogLikelihoodRule", "Query", "QueryStats", "RequestScoring", "ScoreRequest",
           "ScoreResult", "ScoringRule"]
