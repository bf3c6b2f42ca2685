"""Compare two runs, per job and optimizer: what changed, and whether the change is real and too large.

Both runs go through report.summarize (means over seeds, failed trials kept), so a comparison shows
exactly the numbers the report shows. On top of the means, each metric gets the test that fits its
noise, and a row regresses only when the change is both beyond its threshold and statistically
significant — the 95 % confidence interval of the change lies wholly beyond the threshold:

- times (step, optimizer step): the ratio NEW / BASE of the medians of the per-step samples (all
  seeds pooled), with a percentile bootstrap CI (fixed seed, so a comparison is reproducible). A CI
  that contains 1 is shown as "within noise". Records without samples (older files) fall back to the
  plain threshold on the medians, and the cell says so.
- accuracy: a paired test over the seeds both runs share (mean difference, Student-t 95 % CI). With a
  single shared seed there is nothing to pair: plain threshold.
- memory and state bytes: plain threshold. State bytes are exact and a CUDA peak is repeatable, so any
  change beyond the threshold is real; a CPU peak (RSS) moves by pages and arenas, so a peak must also
  grow by more than `min_peak_growth_mib` (0 by default; the nightly sets it on CPU).

A row also regresses when it was `ok` in BASE and is failed or missing in NEW. A row new in NEW is
reported, never a regression. `environment_differences` compares the two runs' stamps (machine,
library versions, threads): numbers from unlike machines are not a comparison, so the table says so.

`export_github_benchmark` writes NEW's numbers in github-action-benchmark's custom format: one file
of times and memory (`customSmallerIsBetter`) and, next to it with `-accuracy` added to the name,
one of accuracy (`customBiggerIsBetter`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from optbench.report import summarize, trials_frame
from optbench.results import MACHINE_KEYS, Record


@dataclass(frozen=True)
class Metric:
    column: str  # in report.summarize's frame
    label: str
    unit: str
    check: str  # "time" | "memory" | "accuracy": which threshold (and which test) applies
    decimals: int
    samples: str | None = None  # time metrics: the Record field holding the per-step samples


METRICS = (
    Metric("step_ms", "step time", "ms", "time", 1, "step_time_samples_s"),
    Metric("opt_step_ms", "optimizer step", "ms", "time", 1, "optimizer_step_samples_s"),
    Metric("train_mem_mib", "peak memory", "MiB", "memory", 0),
    Metric("state_mib", "state", "MiB", "memory", 2),
    Metric("eval_accuracy", "eval accuracy", "%", "accuracy", 1),
)

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000  # the CI bounds move by < 0.5 % between rng seeds at this count
BOOTSTRAP_SEED = 0
MIN_SAMPLES = 3  # per run; fewer and a bootstrap only re-draws the same one or two numbers
# Environment keys that change what a number means: (where, key). "record" is a Record field, "env" its stamp.
ENV_KEYS = (("record", "device_name"), ("env", "cpu"), ("env", "cpu_count"), *(("env", key) for key in MACHINE_KEYS))


class CompareError(ValueError):
    """Two runs that cannot be compared (nothing in common); the message says what each holds."""


@dataclass(frozen=True)
class Thresholds:
    max_slowdown_pct: float = 10.0
    max_memory_growth_pct: float = 5.0
    max_accuracy_drop_pts: float = 1.0
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
    """One metric's change for one row: percent (times, memory) or points (accuracy), with its 95 % CI.

    `low`/`high` are None when no test was possible (no samples, one seed, memory): threshold only.
    """

    delta: float
    low: float | None = None
    high: float | None = None
    test: str = "threshold"  # "bootstrap" | "paired-t" | "threshold"


@dataclass
class Comparison:
    rows: pd.DataFrame  # job, optimizer, base_status, new_status, <column>_base/_new/_delta/_low/_high/_test
    regressions: list[str] = field(default_factory=list)  # one line per offending (job, optimizer, metric)
    commits: tuple[list[str], list[str]] = ([], [])  # git commits seen in BASE, in NEW
    env_differences: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)  # runs timed on an oversubscribed machine


def bootstrap_ratio_of_medians(base: Iterable[float], new: Iterable[float], resamples: int = BOOTSTRAP_RESAMPLES,
                               seed: int = BOOTSTRAP_SEED) -> tuple[float, float, float]:
    """median(new) / median(base) and its percentile-bootstrap CI, each run resampled on its own.

    Medians, because a shared machine throws in the odd slow step; a ratio, because "30 % slower" is
    what a threshold speaks of. Resampling each run independently assumes steps are exchangeable
    within a run, which warm-up exclusion is there to make true.
    """
    b, n = np.asarray(list(base), dtype=float), np.asarray(list(new), dtype=float)
    rng = np.random.default_rng(seed)
    base_medians = np.median(b[rng.integers(0, b.size, (resamples, b.size))], axis=1)
    new_medians = np.median(n[rng.integers(0, n.size, (resamples, n.size))], axis=1)
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(new_medians / base_medians, [tail, 100 - tail])
    return float(np.median(n) / np.median(b)), float(low), float(high)


# Two-sided 97.5 % quantiles of Student's t for 1..30 degrees of freedom (standard table values).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def _t975(dof: int) -> float:
    """Student-t 97.5 % quantile: the table up to 30 dof, then the Cornish-Fisher expansion (error < 1e-3)."""
    if dof <= len(_T975):
        return _T975[dof - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


def paired_mean_difference_ci(base: dict[int, float], new: dict[int, float]) -> tuple[float, float, float, int]:
    """Mean of new - base over the shared seeds, its Student-t 95 % CI, and how many seeds were paired.

    Pairing by seed removes the seed's own luck (data order, init) from the comparison. With one shared
    seed the CI is (nan, nan): nothing to estimate a spread from.
    """
    diffs = np.asarray([new[seed] - base[seed] for seed in sorted(set(base) & set(new))], dtype=float)
    if diffs.size == 0:
        raise ValueError("no shared seeds to pair")
    mean = float(diffs.mean())
    if diffs.size < 2:
        return mean, math.nan, math.nan, 1
    half = _t975(diffs.size - 1) * float(diffs.std(ddof=1)) / math.sqrt(diffs.size)
    return mean, mean - half, mean + half, int(diffs.size)


def _value(row: pd.Series | None, column: str) -> float | None:
    if row is None or column not in row or pd.isna(row[column]):
        return None
    return float(row[column])


Pair = tuple[str, str]  # (job, optimizer)


def _pooled_samples(trials: pd.DataFrame | None, metric: Metric) -> list[float]:
    if trials is None or metric.samples is None or metric.samples not in trials:
        return []
    return [float(v) for samples in trials[metric.samples] if isinstance(samples, list) for v in samples]


def _per_seed(trials: pd.DataFrame | None, column: str) -> dict[int, float]:
    if trials is None or column not in trials:
        return {}
    return {int(seed): float(value) for seed, value in zip(trials["seed"], trials[column], strict=True)
            if pd.notna(value)}


def measure_change(metric: Metric, before: float | None, after: float | None,
                   base_trials: pd.DataFrame | None, new_trials: pd.DataFrame | None) -> Change | None:
    """The change of one metric for one row, tested the way its noise calls for (see the module doc)."""
    if before is None or after is None:
        return None
    if metric.check == "time":
        base_samples, new_samples = _pooled_samples(base_trials, metric), _pooled_samples(new_trials, metric)
        if min(len(base_samples), len(new_samples)) >= MIN_SAMPLES and min(base_samples) > 0:
            ratio, low, high = bootstrap_ratio_of_medians(base_samples, new_samples)
            return Change(100 * (ratio - 1), 100 * (low - 1), 100 * (high - 1), "bootstrap")
    if metric.check == "accuracy":
        base_seeds, new_seeds = _per_seed(base_trials, metric.column), _per_seed(new_trials, metric.column)
        if len(set(base_seeds) & set(new_seeds)) >= 2:
            mean, low, high, _ = paired_mean_difference_ci(base_seeds, new_seeds)
            return Change(100 * mean, 100 * low, 100 * high, "paired-t")
        return Change(100 * (after - before))
    return Change(100 * (after / before - 1)) if before > 0 else None


def _limit(metric: Metric, limits: Thresholds) -> float:
    """The threshold as a signed change: + percent for times and memory, - points for accuracy."""
    return {"time": limits.max_slowdown_pct, "memory": limits.max_memory_growth_pct,
            "accuracy": -limits.max_accuracy_drop_pts}[metric.check]


def crossed(metric: Metric, change: Change | None, limits: Thresholds, growth: float | None = None) -> str | None:
    """The regression message, or None. With a CI, its bound nearest no-change must clear the threshold:
    the gate fires only when it is 95 % sure the change is worse than the threshold allows. `growth` is
    NEW - BASE in the metric's unit, for the peak-memory floor."""
    if change is None:
        return None
    if metric.column == "train_mem_mib" and growth is not None and growth <= limits.min_peak_growth_mib:
        return None
    limit = _limit(metric, limits)
    unit = "pts" if metric.check == "accuracy" else "%"
    if metric.check == "accuracy":  # a drop: the CI's upper bound must lie below -limit
        fired = (change.delta if change.high is None else change.high) < limit
    else:  # growth: the CI's lower bound must lie above +limit
        fired = (change.delta if change.low is None else change.low) > limit
    if not fired:
        return None
    ci = "" if change.low is None else f", 95 % CI {change.low:+.1f} … {change.high:+.1f} {unit}"
    bound = f"-{-limit:g}" if metric.check == "accuracy" else f"{limit:g}"
    return f"{metric.label} {change.delta:+.1f} {unit}{ci} (limit {bound} {unit})"


def _by_pair(summary: pd.DataFrame) -> tuple[dict[Pair, pd.Series], dict[Pair, str]]:
    """The ok row of each (job, optimizer), and every status it shows: 'ok', or 'oom+ok' when a seed failed."""
    ok: dict[Pair, pd.Series] = {}
    statuses: dict[Pair, set[str]] = {}
    for _, row in summary.iterrows():
        pair = (row["job"], row["optimizer"])
        statuses.setdefault(pair, set()).add(row["status"])
        if row["status"] == "ok":
            ok[pair] = row
    return ok, {pair: "+".join(sorted(seen)) for pair, seen in statuses.items()}


def _ok_trials(frame: pd.DataFrame) -> dict[Pair, pd.DataFrame]:
    ok = frame[frame["status"] == "ok"]
    return {(job, optimizer): group for (job, optimizer), group in ok.groupby(["job", "optimizer"], sort=False)}


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


def calibrated_thresholds(base: Sequence[Record], new: Sequence[Record]) -> Thresholds:
    """The device's calibrated thresholds: CUDA's when either run ran on a GPU, else the CPU's."""
    on_cuda = any(str(r.device).startswith("cuda") for r in (*base, *new))
    return DEFAULT_THRESHOLDS["cuda" if on_cuda else "cpu"]


def compare(base: list[Record], new: list[Record], limits: Thresholds) -> Comparison:
    """Row per (job, optimizer) in either run, with BASE, NEW and the tested change per metric."""
    base_frame, new_frame = trials_frame(base), trials_frame(new)
    base_summary, new_summary = summarize(base_frame), summarize(new_frame)
    base_ok, base_status = _by_pair(base_summary)
    new_ok, new_status = _by_pair(new_summary)
    if not set(base_status) & set(new_status):
        raise CompareError(f"BASE and NEW share no job: BASE has {sorted(set(base_summary['job']))}, "
                           f"NEW has {sorted(set(new_summary['job']))}")
    base_trials, new_trials = _ok_trials(base_frame), _ok_trials(new_frame)
    rows, regressions = [], []
    for pair in [*base_status, *(p for p in new_status if p not in base_status)]:
        job, optimizer = pair
        row = {"job": job, "optimizer": optimizer, "base_status": base_status.get(pair, "missing"),
               "new_status": new_status.get(pair, "missing")}
        problems = []
        if pair in base_ok and row["new_status"] != "ok":
            problems.append(f"was ok, now {row['new_status']}")
        for metric in METRICS:
            before, after = _value(base_ok.get(pair), metric.column), _value(new_ok.get(pair), metric.column)
            change = measure_change(metric, before, after, base_trials.get(pair), new_trials.get(pair))
            row.update({f"{metric.column}_base": before, f"{metric.column}_new": after,
                        f"{metric.column}_delta": None if change is None else change.delta,
                        f"{metric.column}_low": None if change is None else change.low,
                        f"{metric.column}_high": None if change is None else change.high,
                        f"{metric.column}_test": None if change is None else change.test})
            growth = None if before is None or after is None else after - before
            problem = crossed(metric, change, limits, growth)
            if problem:
                problems.append(problem)
        row["regression"] = "; ".join(problems)
        regressions.extend(f"{optimizer} [{job}]: {p}" for p in problems)
        rows.append(row)
    return Comparison(rows=pd.DataFrame(rows), regressions=regressions, commits=(run_commits(base), run_commits(new)),
                      env_differences=environment_differences(base, new),
                      busy=[w for w in (busy_machine(base, "BASE"), busy_machine(new, "NEW")) if w])


def _scale(metric: Metric, value: float | None) -> float | None:
    """Accuracy is shown (and exported) in percent; the other metrics already carry their unit."""
    return None if value is None else value * (100 if metric.check == "accuracy" else 1)


def _cell(metric: Metric, row: pd.Series) -> str:
    before = _scale(metric, _value(row, f"{metric.column}_base"))
    after = _scale(metric, _value(row, f"{metric.column}_new"))
    delta = _value(row, f"{metric.column}_delta")
    if before is None and after is None:
        return ""
    show = [("-" if v is None else f"{v:,.{metric.decimals}f}") for v in (before, after)]
    if delta is None:
        return f"{show[0]} → {show[1]}"
    unit = "pts" if metric.check == "accuracy" else "%"
    low, high = _value(row, f"{metric.column}_low"), _value(row, f"{metric.column}_high")
    if low is not None and high is not None:
        noise = ", within noise" if low <= 0 <= high else ""
        return f"{show[0]} → {show[1]} ({delta:+.1f} {unit}, CI {low:+.1f} … {high:+.1f}{noise})"
    untested = ", no CI" if metric.check != "memory" else ""
    return f"{show[0]} → {show[1]} ({delta:+.1f} {unit}{untested})"


LEGEND = ("Change NEW vs BASE with its 95 % CI. Times: ratio of the medians of the per-step samples (seeds "
          "pooled), bootstrap CI; accuracy: paired over shared seeds, Student-t CI; memory and state: plain "
          "threshold (state bytes are exact; a peak must also clear the peak-growth floor, if set). A change "
          "regresses only when its whole CI lies beyond the threshold; \"no CI\": no samples or a single seed, "
          "plain threshold.")


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
        table = pd.DataFrame({
            "optimizer": group["optimizer"],
            "status": [f"{r.base_status} → {r.new_status}" for r in group.itertuples()],
            **{f"{m.label} {m.unit}": [_cell(m, r) for _, r in group.iterrows()] for m in METRICS},
            "verdict": ["REGRESSION: " + r.regression if r.regression else "ok" for r in group.itertuples()],
        })
        parts.append(f"### {job}\n\n" + table.to_markdown(index=False))
    return "\n\n".join(parts) + "\n"


def accuracy_export_path(path: Path) -> Path:
    """Where the bigger-is-better (accuracy) entries go: `name.json` -> `name-accuracy.json`."""
    return path.with_name(f"{path.stem}-accuracy{path.suffix or '.json'}")


def export_github_benchmark(comparison: Comparison, path: Path) -> list[Path]:
    """Write NEW's numbers for github-action-benchmark; returns the two files written."""
    smaller, bigger = [], []
    for _, row in comparison.rows.iterrows():
        for metric in METRICS:
            value = _scale(metric, _value(row, f"{metric.column}_new"))
            if value is None or not math.isfinite(value):
                continue
            entry = {"name": f"{row['optimizer']}: {metric.label} ({row['job']})", "unit": metric.unit,
                     "value": round(value, 6)}
            (bigger if metric.check == "accuracy" else smaller).append(entry)
    paths = [path, accuracy_export_path(path)]
    path.parent.mkdir(parents=True, exist_ok=True)
    for target, entries in zip(paths, (smaller, bigger), strict=True):
        target.write_text(json.dumps(entries, indent=2) + "\n", encoding="utf-8")
    return paths
