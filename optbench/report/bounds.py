"""What a quality figure's bounds say about it: near chance, the job did not train; at the ceiling, or on curves that
stopped moving, the arms are saturated, and a verdict that they are the same says nothing about the optimizers.

Records carry the bounds their workload knows (`metric_chance`: what a model that ignores its input scores, the
majority class's share or the unigram perplexity; `metric_ceiling`: the best any model can score, exact for the
embedded tasks) and their eval curves; these rules read them.

- **untrained**: a final within UNTRAINED_POINTS points of chance (accuracy-like metrics), or at or above the
  unigram perplexity (perplexity, loss). Its quality cells say `untrained`, not a number.
- **saturated**, at the ceiling: every compared arm's mean is within the eval split's binomial noise of the
  ceiling, CEILING_Z · √(c(1-c)/rows) (a metric in [0, 1]; where no ceiling is known, its maximum 1 on every seed);
  for a "min" metric such as perplexity, within the verdict margin of the floor (its noise is not binomial).
- **saturated**, stopped moving: on every seed of every compared arm, the eval curve's last point differs from
  its point at two thirds of the steps by less than FLAT_SHARE of the verdict margin. (A linear decay slows the
  last third, but a job with room still gains more than that in it; a job at its plateau does not.)
- **too coarse**: one eval row is worth more of a metric in [0, 1] than the margin (100/rows points): the verdicts of
  sameness become *inconclusive*, and no minimum detectable difference is finer than one row.

A saturated comparison keeps its interval and minimum detectable difference; it replaces only the verdicts of
sameness (equivalent, non-inferior, inconclusive): a real difference (better, worse) stays a finding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from optbench.report import stats

UNTRAINED_POINTS = 2.0  # within two points of chance: trained on nothing a constant guess does not know
CEILING_Z = 1.96  # the eval split's binomial noise, two-sided 95 %
FLAT_SHARE = 0.5  # "stopped moving": under half the verdict margin over the last third of training
LAST_THIRD_FROM = 2 / 3
SAMENESS = (stats.EQUIVALENT, stats.NON_INFERIOR, stats.INCONCLUSIVE)


def untrained(value: float | None, chance: float | None, mode: str) -> bool:
    """True when a final target metric sits at chance: within UNTRAINED_POINTS points of it for a larger-is-better
    metric in [0, 1], at or beyond it for a smaller-is-better one (perplexity at or above the unigram's)."""
    if not (stats.is_finite(value) and stats.is_finite(chance)):
        return False
    if mode == "max":
        return value <= chance + UNTRAINED_POINTS * stats.POINT  # type: ignore[operator]
    return value >= chance  # type: ignore[operator]


def score_text(value: float, chance: float | None, mode: str) -> str:
    """One trial's score as a running line shows it: the number, or `untrained` where it sits at chance (the table
    that follows says `untrained` for it, and a number there would be a quality figure from a job that did not
    train)."""
    return "untrained" if untrained(value, chance, mode) else f"{value:.4g}"


@dataclass(frozen=True)
class Arm:
    """One optimizer's finals in a comparison: per seed, the final target metric and its eval curve."""

    name: str
    values: Sequence[float]
    curves: Sequence[object]  # [[step, seconds, value], ...] per seed; [] where none was recorded
    steps: int


def ceiling_noise(ceiling: float, rows: int) -> float:
    """The eval split's binomial noise at the ceiling: CEILING_Z · √(c(1-c)/rows), in the metric's unit."""
    return CEILING_Z * math.sqrt(max(ceiling * (1 - ceiling), 0.0) / rows)


def _at_ceiling(arms: Sequence[Arm], ceiling: float | None, rows: int | None, mode: str, scale: str,
                margin: float) -> str | None:
    if any(not arm.values for arm in arms):
        return None
    means = [sum(arm.values) / len(arm.values) for arm in arms]
    if not stats.is_finite(ceiling) and scale == stats.POINTS and mode == "max":  # unknown: the metric's own top
        return "every arm scored 1 on every seed, the metric's maximum" if all(mean >= 1.0 for mean in means) else None
    if not stats.is_finite(ceiling):
        return None
    if scale == stats.POINTS and mode == "max" and rows:
        noise = ceiling_noise(ceiling, rows)  # type: ignore[arg-type]
        if all(mean >= ceiling - noise for mean in means):  # type: ignore[operator]
            return (f"every arm within the eval split's noise (±{100 * noise:.1f} pts over {int(rows)} rows) of the "
                    f"ceiling {ceiling:.4g}")
        return None
    if scale == stats.RELATIVE and mode == "min" and all(mean <= ceiling * (1 + margin / 100) for mean in means):
        return f"every arm within {margin:g} % of the floor {ceiling:.4g}"
    return None


def last_third_change(curve: object, steps: int) -> float | None:
    """The eval curve's last value minus its value at the first point at or past two thirds of `steps`; None when
    the curve does not cover the last third (no curve, or fewer than two points there)."""
    points = [p for p in curve if isinstance(p, list | tuple) and len(p) >= 3] if isinstance(curve, list) else []
    if not points or points[-1][0] < steps:
        return None
    start = next((p for p in points if p[0] >= LAST_THIRD_FROM * steps), None)
    if start is None or start is points[-1] or not (stats.is_finite(start[2]) and stats.is_finite(points[-1][2])):
        return None
    return float(points[-1][2]) - float(start[2])


def _stopped(arms: Sequence[Arm], metric: str, scale: str, margin: float) -> str | None:
    changes = [[last_third_change(curve, arm.steps) for curve in arm.curves] for arm in arms]
    if any(not per_arm or any(c is None for c in per_arm) for per_arm in changes):
        return None
    values = [v for arm in arms for v in arm.values]
    reference = abs(sum(values) / len(values)) if values else 0.0
    tolerance = FLAT_SHARE * margin * (stats.POINT if scale == stats.POINTS else reference / 100)
    if all(abs(c) < tolerance for per_arm in changes for c in per_arm):  # type: ignore[arg-type]
        shown = f"{FLAT_SHARE * margin:g} {stats.UNIT[scale]}"
        return f"on every seed the {metric} moved under {shown} over the last third of training"
    return None


def saturation(arms: Sequence[Arm], ceiling: float | None, rows: int | None, metric: str, mode: str, scale: str,
               margin: float) -> str | None:
    """Why the compared arms are saturated (at the ceiling, or stopped moving), or None when they are not."""
    return _at_ceiling(arms, ceiling, rows, mode, scale, margin) or _stopped(arms, metric, scale, margin)


def one_row_points(rows: int | None, scale: str) -> float | None:
    """What one eval row is worth of a metric in [0, 1], in points (100 / rows): one seed sees no finer difference."""
    return 100 / rows if scale == stats.POINTS and stats.is_finite(rows) and rows > 0 else None  # type: ignore[operator]


def judged(found: stats.Verdict, arms: Sequence[Arm], ceiling: float | None, rows: int | None, metric: str,
           mode: str, scale: str) -> stats.Verdict:
    """`found` as the bounds let it stand. A verdict of sameness on saturated arms is `saturated`; on an eval split
    whose one row is worth more than the margin, `inconclusive` (30 rows, both arms at 1.0 on two seeds, read
    "equivalent within ±1 pt" at a paired spread of 0); and no minimum detectable difference is finer than a row."""
    grain = one_row_points(rows, scale)
    if grain is not None and found.detectable is not None and found.detectable < grain:
        found = dataclasses.replace(found, detectable=grain)
    if found.word not in SAMENESS:
        return found
    if why := saturation(arms, ceiling, rows, metric, mode, scale, found.margin):
        return dataclasses.replace(found, word=stats.SATURATED, text=f"saturated: {why}", seeds_needed=None)
    if grain is not None and grain > found.margin:
        return dataclasses.replace(found, word=stats.INCONCLUSIVE, seeds_needed=None, text=(
            f"inconclusive: one eval row is {grain:.2g} pts, more than the ±{found.margin:g} pts margin (a larger "
            "held-out split resolves it)"))
    return found


def single(values: Iterable[object]) -> float | None:
    """The one value a job's records agree on (its ceiling, chance or eval rows), None where none is known."""
    found = {round(float(v), 12) for v in values if stats.is_finite(v)}  # type: ignore[arg-type]
    return found.pop() if len(found) == 1 else None
