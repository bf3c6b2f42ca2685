"""The scaling sweep's picture: optimizer-state bytes and step time against parameter count, fitted.

The records come from `run --scale` (optbench/workflows/scaling.py):

- AdamW and 8-bit AdamW keep a fixed number of bytes per parameter, so state is *linear* in the
  parameter count: the fitted slope is bytes/param (8 for two fp32 moments; ~2.03 for two uint8
  moments plus one fp32 absmax per 256-element block, a little more where small tensors stay fp32).
- Adafactor (precision label `factored`) keeps a row and a column statistic per matrix: rows + cols
  numbers for an r x c matrix instead of r·c. Its state is linear in `factored_numel` (Σ rows + cols,
  numel for vectors), with a slope of 4 bytes (fp32) per factored element. Against the parameter count
  it grows sublinearly: for a stack of h x h matrices 2h against h², i.e. state ∝ params^0.5. In tiny
  BERT the 30522-row word embedding dominates Σ rows + cols, so the exponent there is smaller still.
  The table reports, for every optimizer, that log-log exponent `k` (state ∝ params^k) beside the
  linear fit, so "linear" (k ≈ 1) and "sublinear" (k < 1) are read off one column.

pandas and matplotlib are imported inside the functions that need them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from optbench.records.record import Record

FIGURE_NAME = "scaling.png"
LEGEND_COLUMNS, LEGEND_ROW_IN = 5, 0.2  # the shared legend below the panels: entries per row, inches per row
FACTORED = "factored"  # the registry's precision label for Adafactor-style row + column state


def trials(records: Iterable[Record] | pd.DataFrame) -> pd.DataFrame:
    """Records as one row per trial (a frame passes through), so an iterator is read once."""
    import pandas as pd

    return records if isinstance(records, pd.DataFrame) else pd.DataFrame([r.to_dict() for r in records])


def scaling_frame(records: Iterable[Record] | pd.DataFrame) -> pd.DataFrame:
    """One row per (optimizer, parameter count) of the ok trials: medians over seeds."""
    import pandas as pd

    frame = trials(records)
    keys = ["optimizer", "state_precision", "num_params"]
    values = ["factored_numel", "state_bytes", "step_time_median_s"]
    if frame.empty or not {"status", *keys, *values} <= set(frame.columns):
        return pd.DataFrame(columns=keys + values)
    frame = frame[(frame["status"] == "ok") & frame["state_bytes"].notna()]
    frame = frame[keys].join(frame[values].apply(pd.to_numeric, errors="coerce"))  # None → NaN
    return (frame.groupby(keys, as_index=False).median()
            .sort_values(["optimizer", "num_params"], ignore_index=True))


def _linear_fit(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, float]:
    """(slope, intercept, R²) of a least-squares line; NaNs where fewer than 2 distinct x."""
    import numpy as np

    x_arr, y_arr = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(np.unique(x_arr)) < 2:
        return math.nan, math.nan, math.nan
    slope, intercept = np.polyfit(x_arr, y_arr, 1)
    residual = float(np.sum((y_arr - (slope * x_arr + intercept)) ** 2))
    total = float(np.sum((y_arr - y_arr.mean()) ** 2))
    r2 = 1.0 - residual / total if total > 0 else 1.0
    return float(slope), float(intercept), r2


def _loglog_exponent(x: Sequence[float], y: Sequence[float]) -> float:
    """k in y ∝ x^k, the slope of the least-squares line through (log x, log y)."""
    points = [(math.log(a), math.log(b)) for a, b in zip(x, y, strict=True) if a > 0 and b > 0]  # NaN compares False
    if len(points) < 2:
        return math.nan
    return _linear_fit([p[0] for p in points], [p[1] for p in points])[0]


def fit_scaling(records: Iterable[Record] | pd.DataFrame) -> pd.DataFrame:
    """Per optimizer: state bytes fitted linearly against the quantity its state is made of.

    Columns: `optimizer`, `fit` (what was fitted), `x` (the record field on the x-axis), `slope_bytes`
    (bytes per unit of x: bytes/param, or bytes per factored element), `intercept_bytes`, `r2`,
    `state_exponent` (k in state ∝ params^k), `step_time_exponent` (the same for the median step
    time), `points`, `params_min`, `params_max`.
    """
    import pandas as pd

    frame = scaling_frame(records)
    rows = []
    for optimizer, group in frame.groupby("optimizer", sort=True):
        factored = (group["state_precision"] == FACTORED).all() and group["factored_numel"].notna().all()
        x_name = "factored_numel" if factored else "num_params"
        slope, intercept, r2 = _linear_fit(group[x_name], group["state_bytes"])
        rows.append({
            "optimizer": optimizer,
            "fit": "state = slope·Σ(rows+cols) + c" if factored else "state = slope·params + c",
            "x": x_name,
            "slope_bytes": slope,
            "intercept_bytes": intercept,
            "r2": r2,
            "state_exponent": _loglog_exponent(group["num_params"], group["state_bytes"]),
            "step_time_exponent": _loglog_exponent(group["num_params"], group["step_time_median_s"]),
            "points": len(group),
            "params_min": int(group["num_params"].min()),
            "params_max": int(group["num_params"].max()),
        })
    return pd.DataFrame(rows)


def render_scaling_markdown(records: Iterable[Record] | pd.DataFrame) -> str:
    """The fit table and the measured points behind it, as markdown."""
    per_trial = trials(records)
    frame = scaling_frame(per_trial)
    if frame.empty:
        return "_no ok records with state bytes to fit_\n"
    fits = fit_scaling(per_trial)
    fit_table = fits.assign(
        slope_bytes=fits["slope_bytes"].map("{:.4f}".format),
        intercept_bytes=fits["intercept_bytes"].map("{:,.0f}".format),
        r2=fits["r2"].map("{:.6f}".format),
        state_exponent=fits["state_exponent"].map("{:.3f}".format),
        step_time_exponent=fits["step_time_exponent"].map("{:.2f}".format),
    ).rename(columns={"slope_bytes": "slope (B per x)", "intercept_bytes": "intercept B", "r2": "R²",
                      "state_exponent": "k: state ∝ params^k", "step_time_exponent": "k: step time ∝ params^k",
                      "params_min": "params min", "params_max": "params max"})
    points = frame.assign(
        state_mib=frame["state_bytes"] / 2**20,
        state_bytes_per_param=frame["state_bytes"] / frame["num_params"],
        step_ms=frame["step_time_median_s"] * 1e3,
    )[["optimizer", "num_params", "state_mib", "state_bytes_per_param", "step_ms"]]
    points = points.rename(columns={"num_params": "params", "state_mib": "state MiB",
                                    "state_bytes_per_param": "state B/param", "step_ms": "step ms"})
    fit_markdown = fit_table.to_markdown(index=False, disable_numparse=True)  # keep the formatting above
    return ("### State bytes vs parameters: fits\n\n" + fit_markdown + "\n\n"
            "### Measured points\n\n" + points.to_markdown(index=False, floatfmt=",.3f") + "\n")


def plot_scaling(records: Iterable[Record] | pd.DataFrame, path: str | Path) -> Path:
    """scaling.png: state bytes and median step time against parameter count per optimizer, log-log. Each
    optimizer keeps its colour, line style and marker from report/canvas.py, so 52 lines do not share ten looks."""
    from optbench.report.canvas import new_figure, optimizer_colour, optimizer_line, optimizer_marker
    from optbench.report.png import save_figure

    frame = scaling_frame(records)
    figure, axes = new_figure(1, 2)
    figure.set_size_inches(11, 4.5)
    state_axis, time_axis = axes[0]
    for optimizer, group in frame.groupby("optimizer", sort=True):
        look = {"color": optimizer_colour(str(optimizer)), "marker": optimizer_marker(str(optimizer)),
                **optimizer_line(str(optimizer))}
        state_axis.plot(group["num_params"], group["state_bytes"], label=optimizer, **look)
        time_axis.plot(group["num_params"], group["step_time_median_s"], label=optimizer, **look)
    if not frame.empty:  # reference: what 8 and 2 bytes/param would be
        span = [frame["num_params"].min(), frame["num_params"].max()]
        for per_param in (8, 2):
            state_axis.plot(span, [per_param * n for n in span], linestyle=":", color="grey", linewidth=1)
            state_axis.annotate(f"{per_param} B/param", (span[1], per_param * span[1]), fontsize=8, color="grey",
                                ha="right", va="bottom")
    state_axis.set(xscale="log", yscale="log", xlabel="parameters (count)", ylabel="optimizer state (bytes)",
                   title="Optimizer state vs model size")
    time_axis.set(xscale="log", yscale="log", xlabel="parameters (count)", ylabel="median train step (s)",
                  title="Step time vs model size")
    for axis in (state_axis, time_axis):
        axis.grid(True, which="both", alpha=0.3)
    handles, labels = state_axis.get_legend_handles_labels()
    if labels:  # one legend for both panels, below them: inside, 52 optimizers' entries squeezed the axes to nothing
        columns = min(len(labels), LEGEND_COLUMNS)
        figure.legend(handles, labels, loc="outside lower center", ncol=columns, fontsize=8)
        figure.set_figheight(4.5 + LEGEND_ROW_IN * math.ceil(len(labels) / columns))
    return save_figure(figure, path, dpi=120)
