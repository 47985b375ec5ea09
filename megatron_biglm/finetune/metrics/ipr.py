"""The Integral Performance Ratio of “Scaling Effects of Instruction Tuning” (§4.2): IPR(f, g) = ∫f / ∫g − 1.

f and g are performance curves over the number of training examples N (e.g. accuracy at
N ∈ {0, 8, 16, 32, 64, 128}); each integral is the trapezoid rule over N on a LINEAR axis,
between the sampled points (no extrapolation).

N = 0: the prompted and instruction-tuned paradigms have a zero-shot point, head fine-tuning
has none (an untrained head is no model). Each IPR integrates over the Ns BOTH curves have
(the intersection of their grids), so instruction-tuned vs prompted (“Scaling Effects of Instruction Tuning”'s Table 2)
includes N = 0, and anything vs head fine-tuning starts at the head's smallest N. The range
used is returned, so a table can say which it was. IPR > 0: f is better on average.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np


def trapezoid(xs: Sequence[float], ys: Sequence[float]) -> float:
    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if xs.shape != ys.shape or xs.ndim != 1 or xs.size < 2:
        raise ValueError(f"need matching 1-D x and y with at least two points, got {xs.shape} and {ys.shape}")
    if np.any(np.diff(xs) <= 0):
        raise ValueError(f"x must be strictly increasing, got {xs.tolist()}")
    return float(np.sum((xs[1:] - xs[:-1]) * (ys[1:] + ys[:-1]) / 2.0))


def common_range(f: Mapping[float, float], g: Mapping[float, float]) -> list[float]:
    """The Ns both curves were measured at, sorted (at least two are needed)."""
    ns = sorted(set(f) & set(g))
    if len(ns) < 2:
        raise ValueError(f"the curves share {ns} only; IPR needs at least two common N values "
                         f"(f has {sorted(f)}, g has {sorted(g)})")
    return ns


def ipr(f: Mapping[float, float], g: Mapping[float, float]) -> tuple[float, list[float]]:
    """(IPR(f, g), the N grid integrated over). `f`, `g`: {N: score}."""
    ns = common_range(f, g)
    below = trapezoid(ns, [g[n] for n in ns])
    if below <= 0:
        raise ValueError(f"∫g = {below} over N {ns}: IPR needs a positive reference curve")
    return trapezoid(ns, [f[n] for n in ns]) / below - 1.0, ns


def ipr_over_seeds(f_runs: Sequence[Mapping[float, float]], g_runs: Sequence[Mapping[float, float]]) -> dict:
    """IPR per seed (runs paired by position: seed i of f with seed i of g), its mean and
    sample standard deviation (“Scaling Effects of Instruction Tuning” Table 2 reports mean ± std), and the IPR of the
    seed-mean curves."""
    if len(f_runs) != len(g_runs) or not f_runs:
        raise ValueError(f"pair the seeds: {len(f_runs)} runs of f, {len(g_runs)} of g")
    per_seed = [ipr(f, g)[0] for f, g in zip(f_runs, g_runs)]
    mean_curve = (lambda runs: {n: float(np.mean([r[n] for r in runs])) for n in set.intersection(*(set(r) for r in runs))})
    of_means, ns = ipr(mean_curve(f_runs), mean_curve(g_runs))
    return {"per_seed": per_seed, "mean": float(np.mean(per_seed)),
            "std": float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else 0.0,
            "of_mean_curves": of_means, "n_range": [min(ns), max(ns)]}
