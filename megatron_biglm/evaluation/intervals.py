"""Confidence intervals for accuracies measured on a few hundred questions.

A next-line accuracy of 0.40 on 100 questions says little without its interval: the Wilson
score interval (unlike acc ± 1.96·stderr) stays inside [0, 1] and is honest at small n.
"""
from __future__ import annotations

import math


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion successes / n (z = 1.96: 95 %)."""
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
