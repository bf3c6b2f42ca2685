"""A comparison (report/compare.py) as the reader gets it: the markdown table with its header and legend, and NEW's
numbers in github-action-benchmark's custom format.

`export_github_benchmark` writes one file of what is better smaller (times, memory, perplexity:
`customSmallerIsBetter`) and, next to it with `-accuracy` added to the name, one of what is better bigger (accuracy:
`customBiggerIsBetter`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from optbench.report import cells, metrics, stats
from optbench.report.compare import Comparison, row_value, shown_unit, shown_value
from optbench.report.metrics import MEMORY, QUALITY, TIME, Metric


def _cell(metric: Metric, row: pd.Series) -> str:
    before = shown_value(metric, row, row_value(row, f"{metric.column}_base"))
    after = shown_value(metric, row, row_value(row, f"{metric.column}_new"))
    delta = row_value(row, f"{metric.column}_delta")
    at_chance = [row.get(f"{metric.column}_{side}_untrained") is True for side in ("base", "new")]
    if before is None and after is None and not any(at_chance):
        return ""
    decimals = 1 if metric.gate == QUALITY and row.get("scale") == stats.POINTS else metric.decimals
    show = [(cells.UNTRAINED if flag else "-" if v is None else f"{v:,.{decimals}f}")
            for flag, v in zip(at_chance, (before, after), strict=True)]
    if delta is None:
        return f"{show[0]} → {show[1]}"
    unit = "pts" if metric.gate == QUALITY and row.get("scale") == stats.POINTS else "%"
    low, high = row_value(row, f"{metric.column}_low"), row_value(row, f"{metric.column}_high")
    spreads = _spreads(metric, row)
    if low is not None and high is not None:
        verdict = row.get(f"{metric.column}_verdict")
        said = f": {verdict}" if isinstance(verdict, str) else (", within noise" if low <= 0 <= high else "")
        return f"{show[0]} → {show[1]} ({delta:+.1f} {unit}, CI {low:+.1f} … {high:+.1f}{said}{spreads})"
    untested = (", no CI: too few runs" if metric.gate == TIME else ", no CI") if metric.gate != MEMORY else ""
    return f"{show[0]} → {show[1]} ({delta:+.1f} {unit}{untested}{spreads})"


def _spreads(metric: Metric, row: pd.Series) -> str:
    """A time cell's runs per side and both spreads: between processes (what the interval is made of) and within
    one (how steady each run was)."""
    runs = row.get(f"{metric.column}_runs")
    if metric.gate != TIME or not isinstance(runs, str):
        return ""
    parts = [f"runs {runs}"]
    for name, column in (("between-run", "between_run"), ("within-run", "within_run")):
        value = row_value(row, f"{metric.column}_{column}")
        if value is not None:
            parts.append(f"{name} ±{value:.1f} %")
    adjustment = row.get(f"{metric.column}_adjustment")
    return "; " + ", ".join(parts) + (f"; {adjustment}" if isinstance(adjustment, str) else "")


LEGEND = ("Change NEW vs BASE with its 95 % CI. Times: ratio of the geometric means of the per-process medians "
          "(each trial is a process; repeats are its seeds), Student-t CI from the spread between processes "
          "(at least 3 per side, or a recorded same-commit history), shown with that between-run spread and the "
          "spread of steps within a run; the optimizer step, with 3 per side, adjusted for each process's own speed "
          "(covariance analysis on the rest of its step, unless that moved too; the unadjusted change beside it); "
          "the target metric: paired over shared seeds, Student-t CI, in the report's verdict words with the "
          "threshold as margin; memory and state: plain threshold (state bytes are exact; a peak must also clear "
          "the peak-growth floor, if set). A change regresses only when its whole CI lies beyond the threshold; "
          "\"no CI\": too few runs or a single seed, plain threshold.")


def render_header(comparison: Comparison) -> str:
    """Which commits are compared, and a warning for every environment difference (unlike machines)."""
    base, new = (", ".join(c[:12] for c in commits) or "unknown" for commits in comparison.commits)
    lines = [f"BASE commit {base} → NEW commit {new}", ""]
    if comparison.env_differences:
        lines += ["**Warning: the runs come from different environments; their numbers are not like with "
                  "like:**", "", *(f"- {line}" for line in comparison.env_differences), ""]
    lines += [f"**Warning: {line}.**\n" for line in comparison.warnings]
    return "\n".join([*lines, LEGEND, ""])


def render_markdown(comparison: Comparison) -> str:
    """The header, then one table per job: BASE → NEW (change, CI) per metric, and the verdict per optimizer."""
    parts = [render_header(comparison)]
    for job, group in comparison.rows.groupby("job", sort=False):
        target = str(group["target_metric"].iloc[0])
        table = pd.DataFrame({
            "optimizer": group["optimizer"],
            "status": [f"{r.base_status} → {r.new_status}" for r in group.itertuples()],
            **{f"{m.name(target)} {shown_unit(m, group.iloc[0])}": [_cell(m, r) for _, r in group.iterrows()]
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
            value = shown_value(metric, row, row_value(row, f"{metric.column}_new"))
            if value is None or not math.isfinite(value):
                continue
            entry = {"name": f"{row['optimizer']}: {metric.name(row['target_metric'])} ({row['job']})",
                     "unit": shown_unit(metric, row), "value": round(value, 6)}
            (bigger if metric.higher_is_better(row["target_mode"]) else smaller).append(entry)
    paths = [path, accuracy_export_path(path)]
    path.parent.mkdir(parents=True, exist_ok=True)
    for target, entries in zip(paths, (smaller, bigger), strict=True):
        target.write_text(json.dumps(entries, indent=2) + "\n", encoding="utf-8")
    return paths
