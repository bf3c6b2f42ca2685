"""The statistics behind a fair verdict: confidence intervals over seeds, paired differences to a
reference optimizer, near-ties on a metric, and the AlgoPerf-style performance profile across jobs.

Seeds are few (often 3), so intervals use Student's t, not the normal approximation: with n = 3 the
95 % half-width is 4.30 standard errors, not 1.96. One seed gives no interval at all (None, shown as
"n/a"), never a misleading ± 0. Quantiles come from scipy (already installed with the plotting stack).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _scipy_stats

CONFIDENCE = 0.95
# A "point" of a metric that lives in [0, 1] (accuracy, F1) is 0.01; other metrics (perplexity, loss)
# have no natural point, so one point there means 1 % of the value.
POINT = 0.01
PROFILE_TAUS = np.linspace(1.0, 4.0, 61)  # AlgoPerf's profile runs tau from 1 (the best) to 4x the best

BETTER, WORSE, SAME = "better", "worse", "no significant difference"


@dataclass(frozen=True)
class Interval:
    """Mean with the half-width of its confidence interval (None below two values) over n values."""

    mean: float
    half_width: float | None
    n: int

    def text(self, decimals: int = 3) -> str:
        ci = "n/a" if self.half_width is None else f"{self.half_width:,.{decimals}f}"
        return f"{self.mean:,.{decimals}f} ± {ci} (n={self.n})"


def t_quantile(n: int, confidence: float = CONFIDENCE) -> float:
    """Two-sided Student-t critical value for a mean over n values (n - 1 degrees of freedom)."""
    if n < 2:
        raise ValueError("a t interval needs at least two values")
    return float(_scipy_stats.t.ppf(0.5 + confidence / 2, n - 1))


def mean_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval | None:
    """Mean ± t * s / sqrt(n) over the finite values; None when there are none, no interval for one."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite:
        return None
    n = len(finite)
    mean = float(np.mean(finite))
    if n < 2:
        return Interval(mean, None, 1)
    sem = float(np.std(finite, ddof=1)) / math.sqrt(n)
    return Interval(mean, t_quantile(n, confidence) * sem, n)


@dataclass(frozen=True)
class Paired:
    """Candidate minus reference over the seeds both have, with its interval and a verdict in words."""

    difference: Interval
    verdict: str  # better | worse | no significant difference | n/a (...)


def paired_difference(candidate: Mapping[int, float], reference: Mapping[int, float], mode: str = "max",
                      confidence: float = CONFIDENCE) -> Paired | None:
    """Compare per-seed values on the seeds both share (same seed = same data order and init, so pairing
    removes the seed-to-seed spread both runs have in common). `mode` "max": larger is better; "min":
    smaller is better. Better/worse only when the interval of the difference excludes zero."""
    shared = sorted(seed for seed in candidate.keys() & reference.keys()
                    if _finite(candidate[seed]) and _finite(reference[seed]))
    if not shared:
        return None
    interval = mean_ci([candidate[s] - reference[s] for s in shared], confidence)
    assert interval is not None
    if interval.half_width is None:
        return Paired(interval, "n/a, one shared seed")
    if interval.half_width == 0 and interval.mean != 0:
        # Every seed moved by exactly the same amount: typical of a coarse metric (accuracy on a small eval
        # split moves in steps of 1/size), where a zero-width interval would call noise significant.
        return Paired(interval, "n/a, identical difference on every seed")
    if abs(interval.mean) <= interval.half_width:
        return Paired(interval, SAME)
    larger = interval.mean > 0
    return Paired(interval, BETTER if larger == (mode == "max") else WORSE)


def point_size(value: float) -> float:
    """One point of a metric near `value`: 0.01 for a fraction (accuracy, F1), else 1 % of the value."""
    return POINT if 0.0 <= value <= 1.0 else POINT * abs(value)


def within(value: float, best: float, points: float) -> bool:
    """True when `value` is no more than `points` points away from `best` (either direction of mode)."""
    return abs(value - best) <= points * point_size(best) + 1e-12


def best_value(values: Sequence[float], mode: str) -> float:
    return max(values) if mode == "max" else min(values)


def tunability(values: Sequence[float | None], mode: str, points: float = 1.0) -> float | None:
    """Share of an optimizer's lr grid whose validation metric is within `points` of its best point.
    Failed or diverged points (None) count in the grid but never as near the best: an optimizer that is
    good only at one lr out of four scores 0.25, one that is good everywhere scores 1."""
    finite = [v for v in values if _finite(v)]
    if not values or not finite:
        return None
    best = best_value(finite, mode)
    return sum(within(v, best, points) for v in finite) / len(values)


def performance_profile(times: Mapping[str, Mapping[str, float | None]],
                        taus: Sequence[float] = PROFILE_TAUS) -> dict[str, list[float]]:
    """AlgoPerf-style profile: for each optimizer, the share of jobs where its time to target is within
    tau x the fastest optimizer's time on that job. `times[job][optimizer]` is None when the optimizer
    never reached the target (or failed); such a job counts against it at every tau."""
    optimizers = sorted({name for per_job in times.values() for name in per_job})
    ratios: dict[str, list[float]] = {name: [] for name in optimizers}
    for per_job in times.values():
        reached = [t for t in per_job.values() if _finite(t) and t > 0]
        best = min(reached) if reached else None
        for name in optimizers:
            value = per_job.get(name)
            ratios[name].append(value / best if best and _finite(value) and value > 0 else math.inf)
    jobs = len(times)
    return {name: [sum(r <= tau for r in ratios[name]) / jobs for tau in taus] for name in optimizers}


def profile_score(fractions: Sequence[float], taus: Sequence[float] = PROFILE_TAUS) -> float:
    """Area under a performance profile, divided by the tau range so the score runs from 0 to 1
    (1: fastest to target on every job)."""
    return float(np.trapezoid(fractions, taus) / (taus[-1] - taus[0]))


def _finite(value: object) -> bool:
    try:
        return value is not None and math.isfinite(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
