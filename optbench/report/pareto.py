"""Comparisons across optimizers that need no interval: the Pareto front of cost against quality, and the
performance profile (AlgoPerf's: for each optimizer, the share of jobs it reached the target within tau times the
fastest optimizer's time).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from optbench.report.stats import is_finite

PROFILE_TAUS = np.linspace(1.0, 4.0, 61)  # AlgoPerf's profile runs tau from 1 (the best) to 4x the best


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """(cost, value): a needs no more and gives no less than b, strictly better in one."""
    return a[0] <= b[0] and a[1] >= b[1] and (a[0] < b[0] or a[1] > b[1])


def pareto_front(costs: Sequence[float], values: Sequence[float]) -> list[int]:
    """Indices of the points no other point dominates (less or equal cost, higher or equal value, strictly
    better in one), ordered by cost; of points equal on both axes the first stays. Orient `values` so that
    larger is better (negate a perplexity)."""
    points = list(zip(costs, values, strict=True))
    front = [i for i, p in enumerate(points)
             if not any(dominates(q, p) or (q == p and j < i) for j, q in enumerate(points) if j != i)]
    return sorted(front, key=lambda i: points[i])


def performance_profile(times: Mapping[str, Mapping[str, float | None]],
                        taus: Sequence[float] = PROFILE_TAUS) -> dict[str, list[float]]:
    """AlgoPerf-style profile: per optimizer, the share of jobs whose time to target (the median with misses
    as infinite) is within tau x the fastest on that job. None or inf: missed, counted against it at every tau."""
    optimizers = sorted({name for per_job in times.values() for name in per_job})
    ratios: dict[str, list[float]] = {name: [] for name in optimizers}
    for per_job in times.values():
        finite = [t for t in per_job.values() if is_finite(t) and t > 0]  # type: ignore[operator]
        best = min(finite) if finite else None
        for name in optimizers:
            value = per_job.get(name)
            ok = best is not None and is_finite(value) and value > 0  # type: ignore[operator]
            ratios[name].append(value / best if ok else math.inf)  # type: ignore[operator]
    return {name: [sum(r <= tau for r in ratios[name]) / len(times) for tau in taus] for name in optimizers}


def profile_score(fractions: Sequence[float], taus: Sequence[float] = PROFILE_TAUS) -> float:
    """Area under a performance profile over the tau range, 0..1 (1: fastest to target on every job)."""
    return float(np.trapezoid(fractions, taus) / (taus[-1] - taus[0]))


# --- the study's lr choice ---------------------------------------------------------------------------------
