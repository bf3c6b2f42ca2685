"""Compare two runs, per job and optimizer: what changed, and whether it crossed a regression threshold.

Both runs go through report.summarize (means over seeds, failed trials kept), so a comparison sees
exactly the numbers the report shows. A row regresses when it got slower (step or optimizer step),
grew in memory (peak: CUDA allocation on GPU, RSS growth over the trial's baseline on CPU; or
optimizer state), lost accuracy, or was `ok` in BASE and is failed or missing in NEW. A row that is
new in NEW is reported, never a regression.

`export_github_benchmark` writes NEW's numbers in github-action-benchmark's custom format: one file
of times and memory (`customSmallerIsBetter`) and, next to it with `-accuracy` added to the name,
one of accuracy (`customBiggerIsBetter`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from optbench.report import summarize, trials_frame
from optbench.results import Record


@dataclass(frozen=True)
class Metric:
    column: str  # in report.summarize's frame
    label: str
    unit: str
    check: str  # "time" | "memory" | "accuracy": which threshold applies
    decimals: int


METRICS = (
    Metric("step_ms", "step time", "ms", "time", 1),
    Metric("opt_step_ms", "optimizer step", "ms", "time", 1),
    Metric("train_mem_mib", "peak memory", "MiB", "memory", 0),
    Metric("state_mib", "state", "MiB", "memory", 2),
    Metric("eval_accuracy", "eval accuracy", "%", "accuracy", 1),
)


class CompareError(ValueError):
    """Two runs that cannot be compared (nothing in common); the message says what each holds."""


@dataclass(frozen=True)
class Thresholds:
    max_slowdown_pct: float = 10.0
    max_memory_growth_pct: float = 5.0
    max_accuracy_drop_pts: float = 1.0


@dataclass
class Comparison:
    rows: pd.DataFrame  # job, optimizer, base_status, new_status, <column>_base/_new/_delta per metric
    regressions: list[str] = field(default_factory=list)  # one line per offending (job, optimizer, metric)


def _value(row: pd.Series | None, column: str) -> float | None:
    if row is None or column not in row or pd.isna(row[column]):
        return None
    return float(row[column])


def _delta(metric: Metric, base: float | None, new: float | None) -> float | None:
    """Percent change for times and memory, accuracy points for accuracy."""
    if base is None or new is None:
        return None
    if metric.check == "accuracy":
        return 100 * (new - base)
    return 100 * (new / base - 1) if base > 0 else None


def _crossed(metric: Metric, delta: float | None, limits: Thresholds) -> str | None:
    """The regression message for this delta, or None when it is within its threshold."""
    if delta is None:
        return None
    if metric.check == "time" and delta > limits.max_slowdown_pct:
        return f"{metric.label} +{delta:.1f} % (limit {limits.max_slowdown_pct:g} %)"
    if metric.check == "memory" and delta > limits.max_memory_growth_pct:
        return f"{metric.label} +{delta:.1f} % (limit {limits.max_memory_growth_pct:g} %)"
    if metric.check == "accuracy" and -delta > limits.max_accuracy_drop_pts:
        return f"{metric.label} {delta:.1f} pts (limit -{limits.max_accuracy_drop_pts:g} pts)"
    return None


Pair = tuple[str, str]  # (job, optimizer)


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


def compare(base: list[Record], new: list[Record], limits: Thresholds) -> Comparison:
    """Row per (job, optimizer) in either run, with BASE, NEW and the change per metric."""
    base_summary, new_summary = summarize(trials_frame(base)), summarize(trials_frame(new))
    base_ok, base_status = _by_pair(base_summary)
    new_ok, new_status = _by_pair(new_summary)
    if not set(base_status) & set(new_status):
        raise CompareError(f"BASE and NEW share no job: BASE has {sorted(set(base_summary['job']))}, "
                           f"NEW has {sorted(set(new_summary['job']))}")
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
            delta = _delta(metric, before, after)
            row.update({f"{metric.column}_base": before, f"{metric.column}_new": after,
                        f"{metric.column}_delta": delta})
            problem = _crossed(metric, delta, limits)
            if problem:
                problems.append(problem)
        row["regression"] = "; ".join(problems)
        regressions.extend(f"{optimizer} [{job}]: {p}" for p in problems)
        rows.append(row)
    return Comparison(rows=pd.DataFrame(rows), regressions=regressions)


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
    change = "" if delta is None else f" ({delta:+.1f} {'pts' if metric.check == 'accuracy' else '%'})"
    return f"{show[0]} → {show[1]}{change}"


def render_markdown(comparison: Comparison) -> str:
    """One table per job: BASE → NEW (change) per metric, and the verdict per optimizer."""
    parts = []
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
