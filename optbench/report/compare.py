"""Compare two runs, per job and optimizer: what changed, and whether the change is real and too large.

Both runs go through frame.summarize (means over seeds, failed trials kept), so a comparison shows exactly
the numbers the report shows. Every metric of the metric table with a gate check is tested the way its noise
calls for, and a row regresses only when the change is both beyond its threshold and statistically
significant — the 95 % confidence interval of the change lies wholly beyond the threshold:

- time (step, optimizer step): each trial is a process of its own and its median one draw; the change is the
  ratio of the geometric means of NEW's and BASE's process medians, with a 95 % interval from the spread
  *between* processes (report/noise.py): at least three per side (`--seeds 0,1,2`), or a recorded history of
  same-commit runs (`history`). Steps within one run are not independent repeats, so their spread is shown
  (within-run) but never makes the interval. Too few runs: no interval, the plain threshold on the change.
- quality (the job's target metric): paired over the seeds both runs share (stats.paired_verdict, the margin
  being the threshold, so the cell reads in the report's verdict words). Accuracy-like metrics (in [0, 1])
  regress on a drop beyond `max_accuracy_drop_pts` points; perplexity, loss and the like on a relative
  worsening beyond `max_metric_worsening_pct` %. One shared seed: plain threshold. A side whose every seed ended at
  chance (report/bounds.py's `untrained`) has no figure: nothing is tested against it, and a row that trained in
  BASE and sits at chance in NEW regresses, said in words.
- memory (peak, state bytes): plain threshold. State bytes are exact and a CUDA peak is repeatable, so any
  change beyond the threshold is real; a CPU peak (RSS) moves by pages and arenas, so a peak must also grow by
  more than `min_peak_growth_mib` (64 on CPU, where RSS jitters by tens of MiB between sweeps; 0 on CUDA).

A row also regresses when it was `ok` in BASE and is failed or missing in NEW. A row new in NEW is reported,
never a regression. `environments.environment_differences` compares the two runs' stamps (machine, library versions,
threads): numbers from unlike machines are not a comparison, so the table says so.

The comparison's table and its export for github-action-benchmark are compare_table's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from optbench.records.environment import names_cuda
from optbench.records.record import Record
from optbench.report import cells, metrics, noise, stats
from optbench.report.environments import busy_machine, environment_differences, lr_differences, run_commits
from optbench.report.frame import key_difference, per_seed, summarize, trials_frame
from optbench.report.metrics import MEMORY, QUALITY, TIME, Metric


class CompareError(ValueError):
    """Two runs that cannot be compared (nothing in common); the message says what each holds."""


@dataclass(frozen=True)
class Thresholds:
    max_slowdown_pct: float = 10.0
    max_memory_growth_pct: float = 5.0
    max_accuracy_drop_pts: float = 1.0  # a target metric in [0, 1] (accuracy, F1): a drop in points
    max_metric_worsening_pct: float = 2.0  # any other target metric (perplexity, loss): worse by this % of BASE
    # Peak memory must also grow by more than this many MiB: CPU peaks are RSS, which moves by pages and
    # malloc arenas (±16 MiB between back-to-back runs here), a lot of percent on a tiny model's 15 MiB.
    min_peak_growth_mib: float = 0.0


# From docs/benchmarks.md "Noise and thresholds". CPU: two back-to-back runs of one commit on the idle 2-core
# box moved medians by up to ±23 % with the CI clear of zero (whole-run shifts a bootstrap over one run's
# steps cannot see; the largest CI bound toward a slowdown was +14 %), so a CPU verdict needs its CI past
# +25 %; peaks gate only beyond the RSS jitter seen (±19 MiB between sweeps, +36 MiB in a CI night's
# benchmark process). On a loaded machine shifts reach +50 % to 15x:
# `busy_machine` says so in the header. GPU: a starting point for a dedicated runner (30-50 timed rounds),
# to be tightened from its own back-to-back spread.
DEFAULT_THRESHOLDS = {
    "cpu": Thresholds(max_slowdown_pct=25.0, max_memory_growth_pct=5.0, max_accuracy_drop_pts=1.0,
                      min_peak_growth_mib=64.0),
    "cuda": Thresholds(max_slowdown_pct=5.0, max_memory_growth_pct=2.0, max_accuracy_drop_pts=1.0),
}


@dataclass(frozen=True)
class Change:
    """One metric's change for one row, NEW vs BASE as the metric moves: % for times, memory and relative
    quality, points for a quality metric in [0, 1]; with its 95 % CI (`low`/`high` None: threshold only)."""

    delta: float
    low: float | None = None
    high: float | None = None
    test: str = "threshold"  # "between-run" | "between-run + history" | noise.ADJUSTED | "paired-t" | "threshold"
    unit: str = "%"
    verdict: str | None = None  # quality, paired: the verdict words against the threshold as margin
    runs: str | None = None  # time: processes per side, "3+3"
    between_run: float | None = None  # time: relative spread between processes (pooled sd of log medians), %
    within_run: float | None = None  # time: relative spread of steps within a process (IQR / median), %
    adjustment: str | None = None  # time: what the covariance analysis did, in words (noise.describe)
    unadjusted: tuple[float, float | None, float | None] | None = None  # time, adjusted: the change before, in %


@dataclass(frozen=True)
class Row:
    """What a metric's test needs to know about one (job, optimizer) beyond its numbers."""

    target_metric: str = "accuracy"
    target_mode: str = "max"
    scale: str = stats.POINTS


@dataclass
class Comparison:
    rows: pd.DataFrame  # job, optimizer, base_status, new_status, <column>_base/_new/_delta/_low/_high/_test
    regressions: list[str] = field(default_factory=list)  # one line per offending (job, optimizer, metric)
    commits: tuple[list[str], list[str]] = ([], [])  # git commits seen in BASE, in NEW
    env_differences: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # a run timed on a busy machine; an optimizer at another lr


def row_value(row: pd.Series | None, column: str) -> float | None:
    if row is None or column not in row or pd.isna(row[column]):
        return None
    return float(row[column])


Pair = tuple[str, str]  # (job_id, optimizer)


def _quality_change(before: float, after: float, base_trials: pd.DataFrame | None, new_trials: pd.DataFrame | None,
                    row: Row, limits: Thresholds) -> Change | None:
    """Paired over shared seeds with the verdict words (margin = the threshold); else the plain difference."""
    margin = limits.max_accuracy_drop_pts if row.scale == stats.POINTS else limits.max_metric_worsening_pct
    sign, unit = (1.0 if row.target_mode == "max" else -1.0), stats.UNIT[row.scale]
    if base_trials is not None and new_trials is not None:
        found = stats.paired_verdict(per_seed(new_trials, new_trials["optimizer"].iloc[0]),
                                     per_seed(base_trials, base_trials["optimizer"].iloc[0]),
                                     row.target_mode, margin, row.scale)
        if found is not None and found.difference.half_width is not None:
            ends = sorted(sign * bound for bound in (found.difference.low, found.difference.high))  # type: ignore
            return Change(sign * found.difference.mean, ends[0], ends[1], "paired-t", unit, found.text)
    if row.scale == stats.POINTS:
        return Change(100 * (after - before), unit=unit)
    return Change(100 * (after / before - 1), unit=unit) if before else None


def _time_change(metric: Metric, base_trials: pd.DataFrame | None, new_trials: pd.DataFrame | None,
                 history: noise.Spread) -> Change | None:
    """The run-to-run change of a time metric (report/noise.py), in %, with both spreads."""
    found = noise.time_change(metric, base_trials, new_trials, history)
    if found is None:
        return None
    ratio, low, high = _percent_change(found)
    percent = [None if v is None else 100 * v for v in (found.between_run, found.within_run)]
    before = found.adjustment.unadjusted if found.adjustment else None
    return Change(ratio, low, high, found.basis if low is not None else "threshold",
                  runs=f"{found.runs[0]}+{found.runs[1]}", between_run=percent[0], within_run=percent[1],
                  adjustment=noise.describe(found.adjustment),
                  unadjusted=None if before is None else _percent_change(before))


def _percent_change(found: noise.TimeChange) -> tuple[float, float | None, float | None]:
    """A time change's ratio and interval as changes in %."""
    low, high = (None if v is None else 100 * (v - 1) for v in (found.low, found.high))
    return 100 * (found.ratio - 1), low, high


def measure_change(metric: Metric, before: float | None, after: float | None, base_trials: pd.DataFrame | None,
                   new_trials: pd.DataFrame | None, row: Row = Row(), limits: Thresholds = Thresholds(),
                   history: noise.Spread = noise.NO_HISTORY) -> Change | None:
    """The change of one metric for one row, tested the way its noise calls for (see the module doc)."""
    if before is None or after is None:
        return None
    if metric.gate == QUALITY:
        return _quality_change(before, after, base_trials, new_trials, row, limits)
    if metric.gate == TIME:
        found = _time_change(metric, base_trials, new_trials, history)
        if found is not None:
            return found
    return Change(100 * (after / before - 1)) if before > 0 else None


def _limit(metric: Metric, limits: Thresholds, row: Row) -> tuple[float, float]:
    """(threshold, worse): the allowed change as a positive size, and +1 when worse means larger, -1 smaller."""
    if metric.gate == TIME:
        return limits.max_slowdown_pct, 1.0
    if metric.gate == MEMORY:
        return limits.max_memory_growth_pct, 1.0
    margin = limits.max_accuracy_drop_pts if row.scale == stats.POINTS else limits.max_metric_worsening_pct
    return margin, (-1.0 if row.target_mode == "max" else 1.0)


def crossed(metric: Metric, change: Change | None, limits: Thresholds, growth: float | None = None,
            row: Row = Row()) -> str | None:
    """The regression message, or None. With a CI, its bound nearest no-change must clear the threshold: the
    gate fires only when it is 95 % sure the change is worse than the threshold allows (for quality that is
    the verdict "worse by at least" the threshold). `growth` is NEW - BASE in MiB, for the peak-memory floor."""
    if change is None:
        return None
    if metric.peak_floor and growth is not None and growth <= limits.min_peak_growth_mib:
        return None
    limit, worse = _limit(metric, limits, row)
    bound = change.delta if change.low is None else (change.low if worse > 0 else change.high)
    if worse * bound <= limit:  # type: ignore[operator]
        return None
    unit = change.unit
    ci = "" if change.low is None else f", 95 % CI {change.low:+.1f} … {change.high:+.1f} {unit}"
    shown = f"{limit:g}" if metric.gate != QUALITY else f"{'-' if worse < 0 else '+'}{limit:g}"
    return f"{metric.name(row.target_metric)} {change.delta:+.1f} {unit}{ci} (limit {shown} {unit})"


def _by_pair(summary: pd.DataFrame) -> tuple[dict[Pair, pd.Series], dict[Pair, str]]:
    """The ok row of each (job, optimizer), and every status it shows: 'ok', or 'oom+ok' when a seed failed."""
    ok: dict[Pair, pd.Series] = {}
    statuses: dict[Pair, set[str]] = {}
    for _, row in summary.iterrows():
        pair = (row["job_id"], row["optimizer"])
        statuses.setdefault(pair, set()).add(row["status"])
        if row["status"] == "ok":
            ok[pair] = row
    return ok, {pair: "+".join(sorted(seen)) for pair, seen in statuses.items()}


def _ok_trials(frame: pd.DataFrame) -> dict[Pair, pd.DataFrame]:
    ok = frame[frame["final"] & (frame["status"] == "ok")]
    return {(job, optimizer): group for (job, optimizer), group in ok.groupby(["job_id", "optimizer"], sort=False)}


def thresholds_for(kind: str) -> Thresholds:
    """The calibrated thresholds of a device kind (`cuda` or `cpu`: job.devices.device_kind of a device name, so that
    `auto` on a GPU machine gets the GPU's)."""
    return DEFAULT_THRESHOLDS[kind]


def calibrated_thresholds(base: Sequence[Record], new: Sequence[Record]) -> Thresholds:
    """The device's calibrated thresholds: CUDA's when either run ran on a GPU (its resolved device), else the CPU's."""
    return thresholds_for("cuda" if any(names_cuda(str(r.device)) for r in (*base, *new)) else "cpu")


def _row_kind(base: pd.Series | None, new: pd.Series | None) -> Row:
    """The target metric, its direction and its scale (points or relative) of a compared row."""
    row = base if base is not None else new
    if row is None:
        return Row()
    scale = row.get("target_scale")
    return Row(str(row["target_metric"]), str(row["target_mode"]), scale if isinstance(scale, str) else stats.POINTS)


CHANGE_COLUMNS = ("delta", "low", "high", "test", "verdict", "runs", "between_run", "within_run", "adjustment",
                  "unadjusted")


def _compare_pair(pair: Pair, ok: tuple[dict, dict], trials: tuple[dict, dict], limits: Thresholds,
                  history: dict[str, noise.Spread]) -> tuple[dict, list[str]]:
    """One (job, optimizer): BASE, NEW and the tested change per gated metric, and the regressions found."""
    base, new = ok[0].get(pair), ok[1].get(pair)
    kind = _row_kind(base, new)
    row, problems = {"target_metric": kind.target_metric, "target_mode": kind.target_mode, "scale": kind.scale}, []
    untrained = [side is not None and cells.untrained_row(side) for side in (base, new)]
    for metric in metrics.gated():
        before, after = row_value(base, metric.column), row_value(new, metric.column)
        if metric.gate == QUALITY:  # a side at chance has no quality figure (report/bounds.py): nothing to test
            before, after = (None if flag else value for flag, value in zip(untrained, (before, after), strict=True))
            row.update({f"{metric.column}_{side}_untrained": flag for side, flag in zip(("base", "new"), untrained,
                                                                                          strict=True)})
            if untrained[1] and before is not None:
                problems.append(f"{metric.name(kind.target_metric)} was {shown_value(metric, row, before):.4g} "
                                f"{shown_unit(metric, row)}, now {cells.UNTRAINED} (at chance)")
        change = measure_change(metric, before, after, trials[0].get(pair), trials[1].get(pair), kind, limits,
                                history.get(metric.column, noise.NO_HISTORY))
        row.update({f"{metric.column}_base": before, f"{metric.column}_new": after,
                    **{f"{metric.column}_{name}": None if change is None else getattr(change, name)
                       for name in CHANGE_COLUMNS}})
        growth = None if before is None or after is None else after - before
        problem = crossed(metric, change, limits, growth, kind)
        if problem:
            problems.append(problem)
    return row, problems


def compare(base: list[Record], new: list[Record], limits: Thresholds, history: Sequence[Record] = ()
            ) -> Comparison:
    """Row per (job, optimizer) in either run, with BASE, NEW and the tested change per gated metric; `history`:
    records of earlier same-commit runs, whose run-to-run spread joins the time intervals (report/noise.py)."""
    spreads = noise.history_spreads(history)
    base_frame, new_frame = trials_frame(base), trials_frame(new)
    base_summary, new_summary = summarize(base_frame), summarize(new_frame)
    base_ok, base_status = _by_pair(base_summary)
    new_ok, new_status = _by_pair(new_summary)
    if not {job for job, _ in base_status} & {job for job, _ in new_status}:  # every optimizer lost: regressions
        raise CompareError(f"BASE and NEW share no job: BASE has {sorted(set(base_summary['job']))}, NEW has "
                           f"{sorted(set(new_summary['job']))}{key_difference(base_summary, new_summary)}")
    labels = {**dict(zip(new_summary["job_id"], new_summary["job"], strict=True)),
              **dict(zip(base_summary["job_id"], base_summary["job"], strict=True))}
    trials = (_ok_trials(base_frame), _ok_trials(new_frame))
    rows, regressions = [], []
    for pair in [*base_status, *(p for p in new_status if p not in base_status)]:
        job, optimizer = labels[pair[0]], pair[1]
        row = {"job": job, "optimizer": optimizer, "base_status": base_status.get(pair, "missing"),
               "new_status": new_status.get(pair, "missing")}
        measured, problems = _compare_pair(pair, (base_ok, new_ok), trials, limits, spreads.get(pair, {}))
        if pair in base_ok and row["new_status"] != "ok":
            problems.insert(0, f"was ok, now {row['new_status']}")
        row.update(measured, regression="; ".join(problems))
        regressions.extend(f"{optimizer} [{job}]: {p}" for p in problems)
        rows.append(row)
    return Comparison(rows=pd.DataFrame(rows), regressions=regressions, commits=(run_commits(base), run_commits(new)),
                      env_differences=environment_differences(base, new),
                      warnings=[*(w for w in (busy_machine(base, "BASE"), busy_machine(new, "NEW")) if w),
                                *lr_differences(base, new)])


def shown_value(metric: Metric, row: pd.Series, value: float | None) -> float | None:
    """A quality metric in [0, 1] is shown (and exported) in percent; the others already carry their unit."""
    points = metric.gate == QUALITY and row.get("scale") == stats.POINTS
    return None if value is None else value * (100 if points else 1)


def shown_unit(metric: Metric, row: pd.Series) -> str:
    if metric.gate != QUALITY:
        return metric.unit
    return "%" if row.get("scale") == stats.POINTS else str(row.get("target_metric"))
