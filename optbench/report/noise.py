"""Run-to-run noise: what the time gate's interval is made of.

Steps inside one process are not independent repeats of a benchmark. A whole process shifts — frequency, memory
placement, page and cache state, what the neighbours do — and every step of it shifts with it: two back-to-back
runs of one commit on an idle CPU moved their medians by -7.6 … +6.2 % with intervals from their own steps that
excluded 0. So the unit of repetition here is the process: each trial runs in a fresh one, its median step is one
draw, and the spread between those draws (`between_run`) is what a change must be told apart from. The spread of
steps within a process (`within_run`) is reported beside it, as what it is: how steady one run was.

The change NEW / BASE is the ratio of the geometric means of the per-process medians; its 95 % interval is the
Student-t interval of the difference of the mean logs, with the variance pooled within groups: the runs of BASE,
the runs of NEW, and — where given — a recorded history of same-commit runs (`history_spreads`), which lends its
degrees of freedom to a comparison of single runs (a nightly). An interval needs MIN_RUNS processes on each side,
or a history of at least MIN_RUNS same-commit runs; otherwise there is none, and the cell says so.

Much of what moves between processes is the process's own speed, and it moves every part of the step alike: over
the 120 same-commit processes of each Adafactor campaign (results/cpu-2core/gate-campaign-trials-6-adafactor*), a
process's median optimizer step and its median rest of the step (forward, backward, zero_grad) correlate at r =
0.88-0.95. A metric that names such a time (`Metric.adjust_for`: one a change to it cannot move) is therefore
compared by covariance analysis (`adjusted`): the log process medians regressed on the side and on the log
covariate, the slope pooled within sides, the change and its Student-t interval read off the side's coefficient
(n - 3 degrees of freedom). That leaves out the process's speed and keeps what the change did. It applies only
when each side has MIN_RUNS processes with both times, and only when the covariate itself did not move (its own
interval contains 1): a change that also slows the rest of the step (a new torch, a new model) is measured
unadjusted, and the cell says why.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as _scipy_stats

from optbench.records.record import Record, job_key
from optbench.report import metrics
from optbench.report.frame import job_id
from optbench.report.metrics import TIME, Metric
from optbench.report.stats import CONFIDENCE

MIN_RUNS = 3  # processes per side (or in a history) before their spread says anything


@dataclass(frozen=True)
class Spread:
    """Within-group deviations of log process medians, ready to pool: their sum of squares and degrees of freedom."""

    sum_squares: float = 0.0
    df: int = 0

    def __add__(self, other: Spread) -> Spread:
        return Spread(self.sum_squares + other.sum_squares, self.df + other.df)

    @property
    def sd(self) -> float | None:
        """The pooled standard deviation of a log median (≈ the relative run-to-run spread); None without df."""
        return math.sqrt(self.sum_squares / self.df) if self.df else None


NO_HISTORY = Spread()


def spread_of(medians: Sequence[float]) -> Spread:
    logs = np.log(np.asarray(medians, dtype=float))
    return Spread(float(((logs - logs.mean()) ** 2).sum()), len(logs) - 1) if len(logs) > 1 else Spread()


def within_run(sample_lists: Iterable[Sequence[float]]) -> float | None:
    """How steady the runs were inside themselves: the median over processes of their steps' inter-quartile range
    over their median (None without samples)."""
    spreads = []
    for samples in sample_lists:
        values = [float(v) for v in samples if v is not None]
        if len(values) >= 4:
            q1, median, q3 = np.quantile(values, [0.25, 0.5, 0.75])
            spreads.append((q3 - q1) / median)
    return float(np.median(spreads)) if spreads else None


ADJUSTED = "between-run, adjusted"


@dataclass(frozen=True)
class Adjustment:
    """What the covariance analysis found: the covariate's own change and — where it did not move, so the
    adjustment `applied` — the slope of log metric on log covariate, the spread between processes left after it,
    and the unadjusted change it replaced."""

    covariate: str  # the covariate's column
    covariate_change: TimeChange
    slope: float | None = None
    residual_sd: float | None = None
    unadjusted: TimeChange | None = None

    @property
    def applied(self) -> bool:
        return self.unadjusted is not None


@dataclass(frozen=True)
class TimeChange:
    """NEW vs BASE for one time metric: the ratio, its interval (None: too few runs), and both spreads."""

    ratio: float
    low: float | None
    high: float | None
    runs: tuple[int, int]
    between_run: float | None  # pooled sd of log process medians (≈ relative spread between runs)
    within_run: float | None
    basis: str  # "between-run" | "between-run + history" | "too few runs" | ADJUSTED
    adjustment: Adjustment | None = None  # the covariance analysis, where the metric names a covariate


def change(base: Sequence[float], new: Sequence[float], history: Spread = NO_HISTORY,
           within: float | None = None) -> TimeChange:
    """The ratio of geometric means of NEW's and BASE's process medians, with a pooled-variance t interval when
    each side has MIN_RUNS processes or the history alone has MIN_RUNS - 1 degrees of freedom."""
    base_logs, new_logs = np.log(base), np.log(new)
    diff = float(new_logs.mean() - base_logs.mean())
    own = spread_of(base) + spread_of(new)
    enough_runs = min(len(base), len(new)) >= MIN_RUNS
    enough_history = history.df >= MIN_RUNS - 1
    pooled = own + history if enough_history else own
    runs = (len(base), len(new))
    if not (enough_runs or enough_history) or pooled.sd is None:
        return TimeChange(math.exp(diff), None, None, runs, pooled.sd, within, "too few runs")
    half = float(_scipy_stats.t.ppf(0.5 + CONFIDENCE / 2, pooled.df)) * pooled.sd * math.sqrt(
        1 / len(base) + 1 / len(new))
    basis = "between-run + history" if enough_history and history.df else "between-run"
    return TimeChange(math.exp(diff), math.exp(diff - half), math.exp(diff + half), runs, pooled.sd, within, basis)


def adjusted(base: Sequence[tuple[float, float]], new: Sequence[tuple[float, float]], covariate: str,
             unadjusted: TimeChange) -> TimeChange:
    """`unadjusted`, replaced by the covariance analysis of (metric, covariate) process medians where the covariate
    did not move; with the analysis recorded either way (see the module doc)."""
    moved = change([x for _, x in base], [x for _, x in new])
    if moved.low is None or moved.high is None:
        return unadjusted
    found = Adjustment(covariate, moved)
    logs = np.log(np.asarray([*base, *new], dtype=float))
    design = np.column_stack([np.ones(len(logs)), np.r_[np.zeros(len(base)), np.ones(len(new))], logs[:, 1]])
    if not moved.low <= 1 <= moved.high or np.linalg.matrix_rank(design) < 3:
        return dataclasses.replace(unadjusted, adjustment=found)
    coefficients, *_ = np.linalg.lstsq(design, logs[:, 0], rcond=None)
    residuals = logs[:, 0] - design @ coefficients
    df = len(logs) - 3
    residual_sd = math.sqrt(float(residuals @ residuals) / df)
    half = float(_scipy_stats.t.ppf(0.5 + CONFIDENCE / 2, df)) * residual_sd * math.sqrt(
        float(np.linalg.inv(design.T @ design)[1, 1]))
    diff = float(coefficients[1])
    found = dataclasses.replace(found, slope=float(coefficients[2]), residual_sd=residual_sd,
                                unadjusted=unadjusted)
    return dataclasses.replace(unadjusted, ratio=math.exp(diff), low=math.exp(diff - half),
                               high=math.exp(diff + half), basis=ADJUSTED, adjustment=found)


def describe(found: Adjustment | None) -> str | None:
    """The covariance analysis in a cell's words: what it was adjusted for and what it replaced, or why not."""
    if found is None:
        return None
    name = metrics.BY_COLUMN[found.covariate].name()
    moved = _percent(found.covariate_change)
    if found.unadjusted is None:
        return f"not adjusted: the {name} moved too ({moved})"
    return (f"adjusted for the {name} (slope {found.slope:.2f}, between-run ±{100 * (found.residual_sd or 0):.1f} % "
            f"left; unadjusted {_percent(found.unadjusted)})")


def _percent(found: TimeChange) -> str:
    """A change and its interval in %, as a cell writes them."""
    low, high = (100 * (v - 1) if v is not None else math.nan for v in (found.low, found.high))
    return f"{100 * (found.ratio - 1):+.1f} %, CI {low:+.1f} … {high:+.1f}"


def time_change(metric: Metric, base_trials: Any, new_trials: Any, history: Spread = NO_HISTORY) -> TimeChange | None:
    """`change` of one time metric between two runs' ok trials (frames, one row per process): each trial's median
    is a draw, its samples give the within-run spread; `adjusted` where the metric names a covariate and each side
    has MIN_RUNS processes with both. None when a side has no trial with the metric."""
    base, new = _medians(base_trials, metric.column), _medians(new_trials, metric.column)
    if not base or not new:
        return None
    found = change(base, new, history, within_run(_sample_lists(base_trials, metric) + _sample_lists(new_trials,
                                                                                                       metric)))
    if metric.adjust_for is None:
        return found
    pairs = [_paired(trials, metric.column, metric.adjust_for) for trials in (base_trials, new_trials)]
    if min(len(p) for p in pairs) < MIN_RUNS:
        return found
    return adjusted(pairs[0], pairs[1], metric.adjust_for, found)


def _usable(value: Any) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def _medians(trials: Any, column: str) -> list[float]:
    if trials is None or column not in trials:
        return []
    return [float(v) for v in trials[column] if _usable(v)]


def _paired(trials: Any, column: str, covariate: str) -> list[tuple[float, float]]:
    """(metric, covariate) of every process that has both."""
    if trials is None or column not in trials or covariate not in trials:
        return []
    return [(float(y), float(x)) for y, x in zip(trials[column], trials[covariate], strict=True)
            if _usable(y) and _usable(x)]


def _sample_lists(trials: Any, metric: Metric) -> list[list[float]]:
    if trials is None or metric.samples is None or metric.samples not in trials:
        return []
    return [list(samples) for samples in trials[metric.samples] if isinstance(samples, list)]


def history_spreads(records: Sequence[Record]) -> dict[tuple[str, str], dict[str, Spread]]:
    """Per (job id, optimizer) and time metric column, the run-to-run spread of a recorded history: every ok record
    is one process, grouped by commit so that only same-commit runs are compared with one another."""
    groups: dict[tuple[tuple[str, str], str], dict[str, list[float]]] = {}
    for record in records:
        if record.status != "ok":
            continue
        pair = (job_id(record.job_key or job_key(record)), record.optimizer)
        per_metric = groups.setdefault((pair, str(record.env.get("git_commit"))), {})
        for metric in metrics.gated():
            value = metric.value(record) if metric.gate == TIME and metric.value else None
            if value is not None and math.isfinite(value) and value > 0:
                per_metric.setdefault(metric.column, []).append(float(value))
    spreads: dict[tuple[str, str], dict[str, Spread]] = {}
    for (pair, _), per_metric in groups.items():
        for column, medians in per_metric.items():
            found = spreads.setdefault(pair, {})
            found[column] = found.get(column, NO_HISTORY) + spread_of(medians)
    return spreads
