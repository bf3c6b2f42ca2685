"""Compare two runs, per job and optimizer: what changed, and whether the change is real and too large.

Both runs go through summary.summarize (means over seeds, failed trials kept), so a comparison shows exactly
the numbers the report shows. Every metric of the metric table with a gate check is tested the way its noise
calls for, and a row regresses only when the change is both beyond its threshold and statistically
significant — the 95 % confidence interval of the change lies wholly beyond the threshold:

- time (step, optimizer step): the ratio NEW / BASE of the medians of the per-step samples (all seeds
  pooled), with a percentile bootstrap CI (stats.bootstrap_ratio_of_medians, fixed seed). A CI that contains
  1 is shown as "within noise". Records without samples fall back to the plain threshold on the medians.
- quality (the job's target metric): paired over the seeds both runs share (stats.paired_verdict, the margin
  being the threshold, so the cell reads in the report's verdict words). Accuracy-like metrics (in [0, 1])
  regress on a drop beyond `max_accuracy_drop_pts` points; perplexity, loss and the like on a relative
  worsening beyond `max_metric_worsening_pct` %. One shared seed: plain threshold.
- memory (peak, state bytes): plain threshold. State bytes are exact and a CUDA peak is repeatable, so any
  change beyond the threshold is real; a CPU peak (RSS) moves by pages and arenas, so a peak must also grow by
  more than `min_peak_growth_mib` (0 by default; the nightly sets it on CPU).

A row also regresses when it was `ok` in BASE and is failed or missing in NEW. A row new in NEW is reported,
never a regression. `environment_differences` compares the two runs' stamps (machine, library versions,
threads): numbers from unlike machines are not a comparison, so the table says so.

`export_github_benchmark` writes NEW's numbers in github-action-benchmark's custom format: one file of what
is better smaller (times, memory, perplexity: `customSmallerIsBetter`) and, next to it with `-accuracy` added to
the name, one of what is better bigger (accuracy: `customBiggerIsBetter`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from optbench.records.record import MACHINE_KEYS, Record
from optbench.report import metrics, stats
from optbench.report.frame import per_seed, summarize, trials_frame
from optbench.report.metrics import MEMORY, QUALITY, TIME, Metric

MIN_SAMPLES = 3  # per run; fewer and a bootstrap only re-draws the same one or two numbers
# Environment keys that change what a number means: (where, key). "record" is a Record field, "env" its stamp.
ENV_KEYS = (("record", "device_name"), ("env", "cpu"), ("env", "cpu_count"), *(("env", key) for key in MACHINE_KEYS))


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
    test: str = "threshold"  # "bootstrap" | "paired-t" | "threshold"
    unit: str = "%"
    verdict: str | None = None  # quality, paired: the verdict words against the threshold as margin


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
    busy: list[str] = field(default_factory=list)  # runs timed on an oversubscribed machine


def _value(row: pd.Series | None, column: str) -> float | None:
    if row is None or column not in row or pd.isna(row[column]):
        return None
    return float(row[column])


Pair = tuple[str, str]  # (job_id, optimizer)


def _pooled_samples(trials: pd.DataFrame | None, metric: Metric) -> list[float]:
    if trials is None or metric.samples is None or metric.samples not in trials:
        return []
    return [float(v) for samples in trials[metric.samples] if isinstance(samples, list) for v in samples]


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


def measure_change(metric: Metric, before: float | None, after: float | None, base_trials: pd.DataFrame | None,
                   new_trials: pd.DataFrame | None, row: Row = Row(), limits: Thresholds = Thresholds()
                   ) -> Change | None:
    """The change of one metric for one row, tested the way its noise calls for (see the module doc)."""
    if before is None or after is None:
        return None
    if metric.gate == QUALITY:
        return _quality_change(before, after, base_trials, new_trials, row, limits)
    if metric.gate == TIME:
        base_samples, new_samples = _pooled_samples(base_trials, metric), _pooled_samples(new_trials, metric)
        if min(len(base_samples), len(new_samples)) >= MIN_SAMPLES and min(base_samples) > 0:
            ratio, low, high = stats.bootstrap_ratio_of_medians(base_samples, new_samples)
            return Change(100 * (ratio - 1), 100 * (low - 1), 100 * (high - 1), "bootstrap")
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


def _stamp(records: list[Record], where: str, key: str) -> set[str] | None:
    """The values a run shows for one key (None: a library stamped as not installed); None when no record
    of the run carries the key at all (an older file), so there is nothing to compare."""
    if where == "record":
        return {str(getattr(r, key)) for r in records if getattr(r, key)} or None
    present = [r.env[key] for r in records if key in r.env]
    return {str(value) for value in present} if present else None


def run_commits(records: list[Record]) -> list[str]:
    """The git commits a run's records were measured at, in first-seen order."""
    return list(dict.fromkeys(str(r.env["git_commit"]) for r in records if r.env.get("git_commit")))


def environment_differences(base: list[Record], new: list[Record]) -> list[str]:
    """One line per environment key whose values differ between the runs (keys one run lacks are skipped)."""
    lines = []
    for where, key in ENV_KEYS:
        before, after = _stamp(base, where, key), _stamp(new, where, key)
        if before is not None and after is not None and before != after:
            lines.append(f"{key}: {', '.join(sorted(before))} → {', '.join(sorted(after))}")
    return lines


BUSY_LOAD_PER_CORE = 1.5  # one sweep keeps the load near the core count; well above it, others shared the CPUs


def busy_machine(records: list[Record], name: str) -> str | None:
    """A warning when a run's trials were stamped with a 1-minute load above BUSY_LOAD_PER_CORE x cores:
    its times include neighbours' work (back-to-back runs here moved +50 % and more at load 15-20)."""
    loads = [(r.env["load_avg_1m"], r.env.get("cpu_count") or 1) for r in records
             if isinstance(r.env.get("load_avg_1m"), int | float)]
    busy = [load for load, cores in loads if load > BUSY_LOAD_PER_CORE * cores]
    if not busy:
        return None
    cores = max(c for _, c in loads)
    return (f"{name} was timed on a busy machine (1-minute load up to {max(busy):.1f} on {cores} cores in "
            f"{len(busy)} of {len(loads)} trials): its times include other work")


def thresholds_for(device: str) -> Thresholds:
    """The calibrated thresholds of a device name (cpu, cuda, cuda:N): CUDA's for a GPU, else the CPU's."""
    return DEFAULT_THRESHOLDS["cuda" if str(device).startswith("cuda") else "cpu"]


def calibrated_thresholds(base: Sequence[Record], new: Sequence[Record]) -> Thresholds:
    """The device's calibrated thresholds: CUDA's when either run ran on a GPU, else the CPU's."""
    on_cuda = any(str(r.device).startswith("cuda") for r in (*base, *new))
    return thresholds_for("cuda" if on_cuda else "cpu")


def _row_kind(base: pd.Series | None, new: pd.Series | None) -> Row:
    """The target metric, its direction and its scale (points or relative) of a compared row."""
    row = base if base is not None else new
    if row is None:
        return Row()
    scale = row.get("target_scale")
    return Row(str(row["target_metric"]), str(row["target_mode"]), scale if isinstance(scale, str) else stats.POINTS)


def _compare_pair(pair: Pair, ok: tuple[dict, dict], trials: tuple[dict, dict], limits: Thresholds
                  ) -> tuple[dict, list[str]]:
    """One (job, optimizer): BASE, NEW and the tested change per gated metric, and the regressions found."""
    base, new = ok[0].get(pair), ok[1].get(pair)
    kind = _row_kind(base, new)
    row, problems = {"target_metric": kind.target_metric, "target_mode": kind.target_mode, "scale": kind.scale}, []
    for metric in metrics.gated():
        before, after = _value(base, metric.column), _value(new, metric.column)
        change = measure_change(metric, before, after, trials[0].get(pair), trials[1].get(pair), kind, limits)
        row.update({f"{metric.column}_base": before, f"{metric.column}_new": after,
                    **{f"{metric.column}_{name}": None if change is None else getattr(change, name)
                       for name in ("delta", "low", "high", "test", "verdict")}})
        growth = None if before is None or after is None else after - before
        problem = crossed(metric, change, limits, growth, kind)
        if problem:
            problems.append(problem)
    return row, problems


def compare(base: list[Record], new: list[Record], limits: Thresholds) -> Comparison:
    """Row per (job, optimizer) in either run, with BASE, NEW and the tested change per gated metric."""
    base_frame, new_frame = trials_frame(base), trials_frame(new)
    base_summary, new_summary = summarize(base_frame), summarize(new_frame)
    base_ok, base_status = _by_pair(base_summary)
    new_ok, new_status = _by_pair(new_summary)
    if not set(base_status) & set(new_status):
        raise CompareError(f"BASE and NEW share no job: BASE has {sorted(set(base_summary['job']))}, "
                           f"NEW has {sorted(set(new_summary['job']))}")
    labels = {**dict(zip(new_summary["job_id"], new_summary["job"], strict=True)),
              **dict(zip(base_summary["job_id"], base_summary["job"], strict=True))}
    trials = (_ok_trials(base_frame), _ok_trials(new_frame))
    rows, regressions = [], []
    for pair in [*base_status, *(p for p in new_status if p not in base_status)]:
        job, optimizer = labels[pair[0]], pair[1]
        row = {"job": job, "optimizer": optimizer, "base_status": base_status.get(pair, "missing"),
               "new_status": new_status.get(pair, "missing")}
        measured, problems = _compare_pair(pair, (base_ok, new_ok), trials, limits)
        if pair in base_ok and row["new_status"] != "ok":
            problems.insert(0, f"was ok, now {row['new_status']}")
        row.update(measured, regression="; ".join(problems))
        regressions.extend(f"{optimizer} [{job}]: {p}" for p in problems)
        rows.append(row)
    return Comparison(rows=pd.DataFrame(rows), regressions=regressions, commits=(run_commits(base), run_commits(new)),
                      env_differences=environment_differences(base, new),
                      busy=[w for w in (busy_machine(base, "BASE"), busy_machine(new, "NEW")) if w])


def _scale(metric: Metric, row: pd.Series, value: float | None) -> float | None:
    """A quality metric in [0, 1] is shown (and exported) in percent; the others already carry their unit."""
    points = metric.gate == QUALITY and row.get("scale") == stats.POINTS
    return None if value is None else value * (100 if points else 1)


def _unit(metric: Metric, row: pd.Series) -> str:
    if metric.gate != QUALITY:
        return metric.unit
    return "%" if row.get("scale") == stats.POINTS else str(row.get("target_metric"))


def _cell(metric: Metric, row: pd.Series) -> str:
    before = _scale(metric, row, _value(row, f"{metric.column}_base"))
    after = _scale(metric, row, _value(row, f"{metric.column}_new"))
    delta = _value(row, f"{metric.column}_delta")
    if before is None and after is None:
        return ""
    decimals = 1 if metric.gate == QUALITY and row.get("scale") == stats.POINTS else metric.decimals
    show = [("-" if v is None else f"{v:,.{decimals}f}") for v in (before, after)]
    if delta is None:
        return f"{show[0]} → {show[1]}"
    unit = "pts" if metric.gate == QUALITY and row.get("scale") == stats.POINTS else "%"
    low, high = _value(row, f"{metric.column}_low"), _value(row, f"{metric.column}_high")
    if low is not None and high is not None:
        verdict = row.get(f"{metric.column}_verdict")
        said = f": {verdict}" if isinstance(verdict, str) else (", within noise" if low <= 0 <= high else "")
        return f"{show[0]} → {show[1]} ({delta:+.1f} {unit}, CI {low:+.1f} … {high:+.1f}{said})"
    untested = ", no CI" if metric.gate != MEMORY else ""
    return f"{show[0]} → {show[1]} ({delta:+.1f} {unit}{untested})"


LEGEND = ("Change NEW vs BASE with its 95 % CI. Times: ratio of the medians of the per-step samples (seeds "
          "pooled), bootstrap CI; the target metric: paired over shared seeds, Student-t CI, in the report's verdict "
          "words with the threshold as margin; memory and state: plain threshold (state bytes are exact; a peak "
          "must also clear the peak-growth floor, if set). A change regresses only when its whole CI lies beyond "
          "the threshold; \"no CI\": no samples or a single seed, plain threshold.")


def render_header(comparison: Comparison) -> str:
    """Which commits are compared, and a warning for every environment difference (unlike machines)."""
    base, new = (", ".join(c[:12] for c in commits) or "unknown" for commits in comparison.commits)
    lines = [f"BASE commit {base} → NEW commit {new}", ""]
    if comparison.env_differences:
        lines += ["**Warning: the runs come from different environments; their numbers are not like with "
                  "like:**", "", *(f"- {line}" for line in comparison.env_differences), ""]
    lines += [f"**Warning: {line}.**\n" for line in comparison.busy]
    return "\n".join([*lines, LEGEND, ""])


def render_markdown(comparison: Comparison) -> str:
    """The header, then one table per job: BASE → NEW (change, CI) per metric, and the verdict per optimizer."""
    parts = [render_header(comparison)]
    for job, group in comparison.rows.groupby("job", sort=False):
        target = str(group["target_metric"].iloc[0])
        table = pd.DataFrame({
            "optimizer": group["optimizer"],
            "status": [f"{r.base_status} → {r.new_status}" for r in group.itertuples()],
            **{f"{m.name(target)} {_unit(m, group.iloc[0])}": [_cell(m, r) for _, r in group.iterrows()]
               for m in metrics.gated()},
            "verdict": ["REGRESSION: " + r.regression if r.regression else "ok" for r in group.itertuples()],
        })
        parts.append(f"### {job}\n\n" + table.to_markdown(index=False))
    return "\n\n".join(parts) + "\n"


def accuracy_export_path(path: Path) -> Path:
    """Where the bigger-is-better entries (accuracy) go: `name.json` -> `name-accuracy.json`."""
    return path.with_name(f"{path.stem}-accuracy{path.suffix or '.json'}")


def export_github_benchmark(comparison: Comparison, path: Path) -> list[Path]:
    """Write NEW's numbers for github-action-benchmark, each by its direction; returns the two files written."""
    smaller, bigger = [], []
    for _, row in comparison.rows.iterrows():
        for metric in metrics.gated():
            value = _scale(metric, row, _value(row, f"{metric.column}_new"))
            if value is None or not math.isfinite(value):
                continue
            entry = {"name": f"{row['optimizer']}: {metric.name(row['target_metric'])} ({row['job']})",
                     "unit": _unit(metric, row), "value": round(value, 6)}
            (bigger if metric.higher_is_better(row["target_mode"]) else smaller).append(entry)
    paths = [path, accuracy_export_path(path)]
    path.parent.mkdir(parents=True, exist_ok=True)
    for target, entries in zip(paths, (smaller, bigger), strict=True):
        target.write_text(json.dumps(entries, indent=2) + "\n", encoding="utf-8")
    return paths
