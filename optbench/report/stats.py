"""The analysis core: every statistic report, plots, compare, recommend and study call, in one place.

- Intervals: Student-t, because seeds are few (with n = 3 the 95 % half-width is 4.30 standard errors, not
  1.96). One value gives no interval (None, shown "n/a"), never a misleading ± 0.
- Verdicts: the paired 95 % interval of candidate − reference, oriented so positive = candidate better,
  read against a margin m (points for a metric in [0, 1] such as accuracy, % of the reference for the
  rest such as perplexity or loss): equivalent / better / worse / non-inferior / inconclusive. "No
  significant difference" is not a verdict: an interval of ±11 points rules out nothing a user cares about.
- Times: compare's run-to-run interval lives in noise.py (processes, not steps, are the repeats).
- Time to target the AlgoPerf way: a seed that never reaches the target counts as infinite time, the
  median over seeds is the figure, and "reached k/n" goes beside it; each crossing is interpolated between the
  evaluations around it, and the time between those evaluations is reported as its resolution.
- The Pareto front, the performance profile and its score, and the study's lr choice (`choose_lr`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as _scipy_stats

CONFIDENCE = 0.95
POINT = 0.01  # one point of a metric in [0, 1] (accuracy, F1)
POINTS, RELATIVE = "points", "relative"  # how a metric's differences are read: in points or in % of the reference
DEFAULT_MARGIN = {POINTS: 1.0, RELATIVE: 2.0}  # 1 point of accuracy; 2 % of a perplexity or loss
UNIT = {POINTS: "pts", RELATIVE: "%"}
MAX_SEEDS = 1000  # "about how many seeds would settle it" stops counting here
LEGACY_TIE = 0.005  # the old fixed near-tie band (half a point): records without val_rows and one seed
RELATIVE_TIE = 0.005  # one seed of a metric not in [0, 1]: 0.5 % of the best value

POWER = 0.8  # the minimum detectable difference is the true difference called "worse" with this probability

# The verdict vocabulary (report, HTML, compare and recommend all use these words). SATURATED replaces a verdict of
# sameness when the arms sit at the metric's ceiling or stopped moving (report/bounds.py says when).
EQUIVALENT, BETTER, WORSE, NON_INFERIOR, INCONCLUSIVE = "equivalent", "better", "worse", "non-inferior", "inconclusive"
SATURATED = "saturated"
VERDICT_WORDS = (EQUIVALENT, BETTER, WORSE, NON_INFERIOR, INCONCLUSIVE, SATURATED)
ONE_SEED = "inconclusive (one seed: no interval)"


def is_finite(value: object) -> bool:
    """True for a real, finite number (None, NaN, inf and text are not)."""
    try:
        return value is not None and not isinstance(value, bool) and math.isfinite(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class Interval:
    """Mean with the half-width of its confidence interval (None below two values) over n values."""

    mean: float
    half_width: float | None
    n: int

    @property
    def low(self) -> float | None:
        return None if self.half_width is None else self.mean - self.half_width

    @property
    def high(self) -> float | None:
        return None if self.half_width is None else self.mean + self.half_width

    def text(self, decimals: int = 3) -> str:
        ci = "n/a" if self.half_width is None else f"{self.half_width:,.{decimals}f}"
        return f"{self.mean:,.{decimals}f} ± {ci} (n={self.n})"


def t_quantile(n: int, confidence: float = CONFIDENCE) -> float:
    """Two-sided Student-t critical value for a mean over n values (n - 1 degrees of freedom)."""
    if n < 2:
        raise ValueError("a t interval needs at least two values")
    return float(_scipy_stats.t.ppf(0.5 + confidence / 2, n - 1))


def mean_ci(values: Iterable[float | None], confidence: float = CONFIDENCE) -> Interval | None:
    """Mean ± t * s / sqrt(n) over the finite values; None when there are none, no interval for one."""
    finite = [float(v) for v in values if is_finite(v)]  # type: ignore[arg-type]
    if not finite:
        return None
    n = len(finite)
    if n < 2:
        return Interval(finite[0], None, 1)
    sem = float(np.std(finite, ddof=1)) / math.sqrt(n)
    return Interval(float(np.mean(finite)), t_quantile(n, confidence) * sem, n)


def scale_of(mode: str, values: Iterable[float | None]) -> str:
    """POINTS for a larger-is-better metric whose values all lie in [0, 1] (accuracy, F1), else RELATIVE
    (perplexity, loss: "min" metrics have no natural point, so a difference is read in % of the reference)."""
    finite = [float(v) for v in values if is_finite(v)]  # type: ignore[arg-type]
    return POINTS if mode == "max" and finite and all(0.0 <= v <= 1.0 for v in finite) else RELATIVE


def margin_text(margin: float, scale: str) -> str:
    return f"{margin:g} pt{'' if margin == 1 else 's'}" if scale == POINTS else f"{margin:g} %"


def oriented_differences(candidate: Mapping[int, float], reference: Mapping[int, float], mode: str,
                         scale: str) -> list[float]:
    """Per shared seed, candidate − reference with positive = candidate better: in points (x100) or in %
    of the reference. Same seed = same data order and init, so pairing removes the spread both share."""
    sign = 1.0 if mode == "max" else -1.0
    shared = sorted(s for s in candidate.keys() & reference.keys()
                    if is_finite(candidate[s]) and is_finite(reference[s]) and (scale == POINTS or reference[s]))
    if scale == POINTS:
        return [sign * 100 * (candidate[s] - reference[s]) for s in shared]
    return [sign * 100 * (candidate[s] - reference[s]) / abs(reference[s]) for s in shared]


@dataclass(frozen=True)
class Verdict:
    """A paired comparison in words: `word` is one of VERDICT_WORDS, `text` the phrase with the margin."""

    word: str
    text: str
    difference: Interval  # oriented (positive = candidate better), in `unit`
    margin: float
    unit: str
    seeds_needed: int | None = None  # inconclusive: about how many paired seeds would settle it
    excludes_zero: bool = False
    detectable: float | None = None  # the minimum detectable difference at this n (None: one seed)


def seeds_to_settle(mean: float, sd: float, margin: float) -> int | None:
    """Smallest n whose t half-width t(n-1)·sd/√n would fit inside the boundary the mean can reach most
    easily: above −margin (equivalent, non-inferior or better) or, for a mean below −margin, below it
    (worse). None: the mean sits on −margin (nothing settles it) or n would exceed MAX_SEEDS."""
    room = mean + margin if mean > -margin else -margin - mean
    if room <= 0:
        return None
    if sd <= 0:
        return 2
    n = np.arange(2, MAX_SEEDS + 1)
    fits = _scipy_stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1) * sd / np.sqrt(n) < room
    return int(n[np.argmax(fits)]) if fits.any() else None


def minimum_detectable_difference(sd: float, n: int, margin: float, power: float = POWER) -> float | None:
    """The smallest true difference the paired comparison calls "worse by at least m" with probability `power`:
    m + (t(1-α/2, n-1) + t(power, n-1)) · sd / √n, α = 1 - CONFIDENCE (the verdict's upper bound must fall below
    -m; with the true difference there, the estimate clears it `power` of the time). None below two seeds."""
    if n < 2:
        return None
    dof = n - 1
    quantiles = float(_scipy_stats.t.ppf(0.5 + CONFIDENCE / 2, dof) + _scipy_stats.t.ppf(power, dof))
    return margin + quantiles * sd / math.sqrt(n)


def verdict(differences: Sequence[float], margin: float, scale: str = POINTS) -> Verdict | None:
    """The verdict word for oriented paired differences (positive = better) against the margin m, with the
    minimum detectable difference at their n."""
    interval = mean_ci(differences)
    if interval is None:
        return None
    m, unit = margin_text(margin, scale), UNIT[scale]
    if interval.half_width is None:
        return Verdict(INCONCLUSIVE, ONE_SEED, interval, margin, unit)
    low, high = interval.mean - interval.half_width, interval.mean + interval.half_width
    sd = float(np.std(differences, ddof=1))
    found = dict(difference=interval, margin=margin, unit=unit, excludes_zero=low > 0 or high < 0,
                 detectable=minimum_detectable_difference(sd, interval.n, margin))
    for word, text, holds in ((EQUIVALENT, f"equivalent within ±{m}", -margin < low and high < margin),
                              (BETTER, f"better by at least {m}", low > margin),
                              (WORSE, f"worse by at least {m}", high < -margin),
                              (NON_INFERIOR, f"non-inferior (at most {m} worse)", low > -margin)):
        if holds:
            return Verdict(word, text, **found)
    needed = seeds_to_settle(interval.mean, sd, margin)
    hint = f"about {needed} seeds would settle it" if needed else f"more than {MAX_SEEDS} seeds would be needed"
    return Verdict(INCONCLUSIVE, f"inconclusive ({hint})", seeds_needed=needed, **found)


def paired_verdict(candidate: Mapping[int, float], reference: Mapping[int, float], mode: str,
                   margin: float | None = None, scale: str | None = None) -> Verdict | None:
    """Candidate vs reference on the seeds both ran; None when they share none. `margin` None: the default
    of the metric's scale (1 point, or 2 % of the reference); `scale` None: read from the values."""
    scale = scale or scale_of(mode, [*candidate.values(), *reference.values()])
    differences = oriented_differences(candidate, reference, mode, scale)
    return verdict(differences, DEFAULT_MARGIN[scale] if margin is None else margin, scale)


# --- time to target, Pareto front, performance profile ---------------------------------------------------

@dataclass(frozen=True)
class Crossing:
    """Where an eval curve first reaches a target: step and training seconds, interpolated linearly between the
    last point short of it and the first at or past it, and the width of that bracket in seconds — the time
    between two evaluations, which is how finely the curve resolves the crossing (the first point's bracket starts
    at 0 s: nothing was evaluated before it)."""

    step: float
    seconds: float
    bracket_s: float


def reached(curve: object, target: float, mode: str) -> Crossing | None:
    """The first crossing of `target` on an eval curve of [step, training seconds, value] points; None if never."""
    before = None
    for point in curve if isinstance(curve, list) else []:
        step, seconds, value = (float(v) if v is not None else math.nan for v in point[:3])
        if not is_finite(value):
            continue
        if value >= target if mode == "max" else value <= target:
            if before is None:
                return Crossing(step, seconds, seconds)
            share = (target - before[2]) / (value - before[2]) if value != before[2] else 1.0
            return Crossing(before[0] + share * (step - before[0]), before[1] + share * (seconds - before[1]),
                            seconds - before[1])
        before = (step, seconds, value)
    return None


@dataclass(frozen=True)
class TimeToTarget:
    """AlgoPerf's rule: a seed that missed counts as infinite, the median over all seeds is the figure."""

    median: float  # inf when at least half the seeds missed
    reached: int
    n: int
    resolution: float | None = None  # the seconds between the evaluations that bracket the crossings (median)

    @property
    def everywhere(self) -> bool:
        """Reached on every seed: only then may it be called first or fastest."""
        return self.n > 0 and self.reached == self.n

    def text(self, decimals: int = 1) -> str:
        value = "missed" if math.isinf(self.median) else f"{self.median:,.{decimals}f}"
        finer = "" if self.resolution is None or math.isinf(self.median) else \
            f"; curve every {self.resolution:,.{decimals}f}"
        return f"{value} (reached {self.reached}/{self.n}{finer})"


def time_to_target(values: Iterable[float | None]) -> TimeToTarget | None:
    """Median over the seeds with a miss (None or inf) as infinite; NaN (no curve) is not a seed. None: no seed."""
    seeds = [math.inf if v is None or v == math.inf else float(v) for v in values
             if v is None or not (isinstance(v, float) and math.isnan(v))]
    if not seeds:
        return None
    return TimeToTarget(float(np.median(seeds)), sum(math.isfinite(v) for v in seeds), len(seeds))


def best_value(values: Sequence[float], mode: str) -> float:
    return max(values) if mode == "max" else min(values)


def tunability(values: Sequence[float | None], mode: str, points: float = 1.0) -> float | None:
    """Share of an optimizer's lr grid whose validation metric is within `points` points (1 % of the value
    for a metric not in [0, 1]) of its best. Failed points (None) count in the grid, never as near."""
    finite = [float(v) for v in values if is_finite(v)]  # type: ignore[arg-type]
    if not finite:
        return None
    best = best_value(finite, mode)
    size = POINT if 0.0 <= best <= 1.0 else POINT * abs(best)
    return sum(abs(v - best) <= points * size + 1e-12 for v in finite) / len(values)


@dataclass(frozen=True)
class LrPoint:
    lr: float
    status: str  # "ok" when every tune seed finished ok; else the first failure; "missing" when none ran
    value: float | None  # mean validation metric over the tune seeds; None unless ok and finite
    values: tuple[float, ...] = ()  # one per tune seed


@dataclass
class LrChoice:
    """The tune stage's outcome for one optimizer: every grid point, and the lr chosen (None: none ok)."""

    optimizer: str
    points: list[LrPoint]
    metric: str
    mode: str
    tune_steps: int
    lr: float | None = None
    note: str = ""
    tunability: float | None = field(default=None)
    band: float | None = None  # the near-tie band used, in the metric's own unit
    band_basis: str = ""  # what the band was derived from, in words
    tune_seeds: int = 0
    chance: float | None = None  # the metric at chance on validation (validation_chance): there, no training
    eval_chance: float | None = None  # the same on the eval split, whose curves a target fixed from tuning times


def tie_band(points: Sequence[LrPoint], mode: str, val_rows: int | None = None) -> tuple[float, str]:
    """The near-tie band: the standard error of the difference of two grid points' means, √2 x SE(mean).

    Per tune seed, a metric in [0, 1] has the binomial error √(p(1-p)/val_rows) of its validation split (p kept
    one row from 0 and 1, where that error would be 0 and every lr short of the best's perfect score a loser),
    combined (root sum of squares) with the pooled across-seed SD when there are >= 2 tune seeds; other
    metrics use the seed SD alone, or 0.5 % of the best value with one seed. Records without `val_rows`
    and one seed (schema 1) keep the old fixed half point.
    """
    usable = [p for p in points if p.value is not None]
    best = best_value([p.value for p in usable], mode)  # type: ignore[misc]
    seeds = max(len(p.values) for p in usable)
    spread = [p.values for p in usable if len(p.values) >= 2]
    dof = sum(len(v) - 1 for v in spread)
    pooled = math.sqrt(sum((len(v) - 1) * float(np.var(v, ddof=1)) for v in spread) / dof) if dof else None
    parts, basis = [], []
    if scale_of(mode, [p.value for p in usable]) == POINTS and val_rows:
        near = min(max(best, 1 / val_rows), 1 - 1 / val_rows)  # at 0 or 1 the binomial error is 0: one row off
        parts.append(near * (1 - near) / val_rows)
        basis.append(f"binomial error of {val_rows} validation rows")
    if pooled is not None:
        parts.append(pooled**2)
        basis.append(f"seed SD over {seeds} tune seeds")
    if not parts:
        if scale_of(mode, [p.value for p in usable]) == POINTS:
            return LEGACY_TIE, "half a point: the records carry no val_rows"
        return RELATIVE_TIE * abs(best), "0.5 % of the best (one tune seed)"
    return math.sqrt(2 * sum(parts) / seeds), " + ".join(basis)


def choose_lr(points: Sequence[LrPoint], mode: str, band: float | None = None) -> tuple[float | None, str]:
    """(chosen lr, why): the best mean validation metric; every lr within `band` of it is a near-tie, taken
    toward the lr nearest (in log distance) the grid's geometric middle, an exact tie to the smaller lr,
    since a lead smaller than the noise should not drag the choice to the edge of the grid."""
    usable = [p for p in points if p.status == "ok" and p.value is not None]
    if not usable:
        return None, "no tune trial finished ok"
    band = tie_band(usable, mode)[0] if band is None else band
    best = best_value([p.value for p in usable], mode)  # type: ignore[misc]
    near = [p for p in usable if abs(p.value - best) <= band + 1e-12]  # type: ignore[operator]
    lrs = [p.lr for p in points]
    middle = math.sqrt(min(lrs) * max(lrs))
    chosen = min(near, key=lambda p: (round(abs(math.log(p.lr / middle)), 9), p.lr))  # 1e-4 and 1e-2 around 1e-3 tie
    if len(near) == 1:
        return chosen.lr, "best mean validation metric"
    return chosen.lr, (f"{len(near)} lrs within the near-tie band {band:.3g} of the best; took the one nearest "
                       f"the grid's geometric middle {middle:.3g}")


def _point(lr: float, records: Sequence) -> LrPoint:
    """One grid point from its tune records (latest per seed); any failed seed fails the point."""
    by_seed = {int(r.seed): r for r in records}
    if not by_seed:
        return LrPoint(lr, "missing", None)
    failed = [r.status if r.status != "ok" else "no metric" for r in by_seed.values()
              if r.status != "ok" or not is_finite(r.val_metric)]
    if failed:
        return LrPoint(lr, failed[0], None)
    values = tuple(float(by_seed[s].val_metric) for s in sorted(by_seed))
    return LrPoint(lr, "ok", float(np.mean(values)), values)


def recorded_chance(records: Sequence, name: str = "metric_chance") -> float | None:
    """A split's chance level as the records store it (field `name`: the eval split's `metric_chance` or the
    validation split's `val_chance`), the first finite one; None where no record has it."""
    return next((float(getattr(r, name)) for r in records if is_finite(getattr(r, name, None))), None)


def validation_chance(records: Sequence) -> float | None:
    """The chance level the tune stage's validation scores are judged against: the validation split's own
    (`val_chance`); records from before it was stored give the eval split's, the nearest they have."""
    found = recorded_chance(records, "val_chance")
    return found if found is not None else recorded_chance(records)


def choice_from_records(optimizer: str, grid: Sequence[float], records: Iterable, tune_steps: int) -> LrChoice:
    """Rebuild one optimizer's lr choice from its tune records alone, so a resumed study chooses the same."""
    records = list(records)
    metric = next((r.target_metric for r in records), "accuracy")
    mode = next((r.target_mode for r in records), "max")
    points = [_point(lr, [r for r in records if math.isclose(float(r.lr), lr, rel_tol=1e-9)]) for lr in grid]
    # The choice, its tie-break middle and its tunability read the lrs tried: a walk (study.next_on_walk) leaves
    # grid points untried, and the summary, which sees only records, must choose the same.
    points = [p for p in points if p.status != "missing"] or points
    usable = [p for p in points if p.status == "ok"]
    choice = LrChoice(optimizer, points, metric, mode, tune_steps,
                      tunability=tunability([p.value for p in points], mode),
                      tune_seeds=max((len(p.values) for p in usable), default=0),
                      chance=validation_chance(records),
                      eval_chance=recorded_chance(records))
    if usable:
        val_rows = max((int(r.val_rows) for r in records if r.val_rows), default=None)
        choice.band, choice.band_basis = tie_band(usable, mode, val_rows)
    choice.lr, choice.note = choose_lr(points, mode, choice.band)
    return choice
