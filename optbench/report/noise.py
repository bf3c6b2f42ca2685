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
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class TimeChange:
    """NEW vs BASE for one time metric: the ratio, its interval (None: too few runs), and both spreads."""

    ratio: float
    low: float | None
    high: float | None
    runs: tuple[int, int]
    between_run: float | None  # pooled sd of log process medians (≈ relative spread between runs)
    within_run: float | None
    basis: str  # "between-run" | "between-run + history" | "too few runs"


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


def time_change(metric: Metric, base_trials: Any, new_trials: Any, history: Spread = NO_HISTORY) -> TimeChange | None:
    """`change` of one time metric between two runs' ok trials (frames, one row per process): each trial's median
    is a draw, its samples give the within-run spread. None when a side has no trial with the metric."""
    base, new = _medians(base_trials, metric), _medians(new_trials, metric)
    if not base or not new:
        return None
    return change(base, new, history, within_run(_sample_lists(base_trials, metric) + _sample_lists(new_trials,
                                                                                                      metric)))


def _medians(trials: Any, metric: Metric) -> list[float]:
    if trials is None or metric.column not in trials:
        return []
    return [float(v) for v in trials[metric.column] if v is not None and math.isfinite(v) and v > 0]


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
