"""What every figure of the report shares: one matplotlib `Figure` per figure on the Agg canvas (never pyplot, so it
renders headless and leaves no global state), a row of panels per job, each optimizer's colour and line style in
every figure, stacked bars, the target metric's axis label, and which trials carry a curve to draw.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from optbench.optimizers import REGISTRY
from optbench.report.png import save_figure

DPI = 130
PANEL_IN = (6.4, 4.6)  # width, height of one panel in inches


def mean_band(curves: Sequence[Sequence[float | None]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-step mean and standard deviation over seeds; None (a skipped step) and ragged tails are ignored."""
    length = max((len(c) for c in curves), default=0)
    table = np.full((len(curves), length), np.nan)
    for row, curve in enumerate(curves):
        table[row, :len(curve)] = [np.nan if v is None else v for v in curve]
    counts = np.sum(~np.isnan(table), axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.nansum(table, axis=0) / counts
        std = np.sqrt(np.nansum((table - mean) ** 2, axis=0) / np.maximum(counts - 1, 1))
    return mean, np.where(counts > 1, std, 0.0)


def _registry_index(name: str) -> int:
    names = list(REGISTRY)
    return names.index(name) if name in names else len(names) + sum(map(ord, name))


def optimizer_colour(name: str) -> str:
    """The same colour for an optimizer in every figure (registry order on the tab10 palette)."""
    return f"C{_registry_index(name) % 10}"


def optimizer_line(name: str) -> dict[str, object]:
    """A line style and width per optimizer as well, so curves that coincide (and colour-blind readers) still
    tell them apart: a thinner dashed line drawn over a thicker solid one leaves both visible."""
    index = _registry_index(name) % 4
    return {"ls": ["-", "--", ":", "-."][index], "lw": 2.6 - 0.4 * index}


MARKERS = ("o", "s", "^", "D", "v", "P", "X")  # seven: with ten colours and four line styles, 140 entries differ


def optimizer_marker(name: str) -> str:
    """A marker per optimizer for figures of points joined by lines: with the colour (period 10) and the line style
    (period 4) it tells apart the first 140 registry entries, where colour alone repeats after ten."""
    return MARKERS[_registry_index(name) % len(MARKERS)]


def new_figure(rows: int, cols: int) -> tuple[Figure, np.ndarray]:
    """A figure of rows x cols panels of PANEL_IN inches each, its axes always a 2-D array."""
    fig = Figure(figsize=(PANEL_IN[0] * cols, PANEL_IN[1] * rows), dpi=DPI, layout="constrained")
    return fig, np.atleast_2d(fig.subplots(rows, cols, squeeze=False))


def save_titled(fig: Figure, title: str, path: Path) -> Path:
    """The figure under its title, written as a palette PNG (png.save_figure)."""
    fig.suptitle(title, fontsize=11)
    return save_figure(fig, path)


def stacked_bars(ax, names: pd.Series, parts: list[tuple[str, np.ndarray, str]], ylabel: str) -> np.ndarray:
    """Stacked bars per name from (label, heights, colour) parts, bottom first; the legend reads top first."""
    bottom = np.zeros(len(names))
    for label, heights, colour in parts:
        ax.bar(names, heights, bottom=bottom, color=colour, label=label, edgecolor="white", lw=0.5)
        bottom += heights
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    return bottom


def job_panels(frame: pd.DataFrame, cols: int = 1) -> tuple[Figure, list[tuple[np.ndarray, str, pd.DataFrame]]]:
    """The figure, and per job (one row of panels each): its axes row, its label and its rows of `frame`."""
    fig, axes = new_figure(frame["job"].nunique(), cols)
    return fig, [(axes[i], job, frame[frame["job"] == job]) for i, job in enumerate(dict.fromkeys(frame["job"]))]


def _carries(value: object) -> bool:
    """A curve with a value in it, or a non-empty split."""
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return any(v is not None for v in items)


def carrying(trials: pd.DataFrame, column: str) -> pd.DataFrame:
    """The ok trials whose `column` holds data (a curve with a value, a non-empty split)."""
    if trials.empty or column not in trials:
        return trials.iloc[:0]
    ok = trials[trials["status"] == "ok"]
    return ok[ok[column].map(_carries)]


def metric_label(frame: pd.DataFrame, prefix: str = "eval") -> tuple[str, str]:
    """(axis label, mode) for the job's target metric as the records name it."""
    mode = str(frame["target_mode"].iloc[0])
    return f"{prefix} {frame['target_metric'].iloc[0]} ({'higher' if mode == 'max' else 'lower'} is better)", mode
