"""The report's figures: the memory-metric trade-off, loss curves, the peak-memory split, where the state bytes
go, update fidelity, and for studies the lr sensitivity, the eval metric against time and the performance profile.

Figures are drawn on the canvas every figure shares (canvas.py: Agg, never pyplot, so they render headless). This
module is imported only when the report writes figures, so the table-only paths never pay for matplotlib.

Inputs are frame.py's frames: `trials` (one row per trial, with curves) and `summary` (one row per job x
optimizer x status, over seeds). One row of panels per job. Error bars and bands are 95 % Student-t intervals
(stats.py); a single seed draws none. Time to target follows AlgoPerf's rule (stats.time_to_target).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from optbench.optimizers.base import MODULE_KINDS
from optbench.records.record import MIB
from optbench.report import cells, pareto, stats
from optbench.report.canvas import (
    PANEL_IN,
    carrying,
    job_panels,
    mean_band,
    metric_label,
    new_figure,
    optimizer_colour,
    optimizer_line,
    save_titled,
    stacked_bars,
)
from optbench.report.frame import lr_choices, time_to_target_by_job

MARKER_AREA_PT2 = (40.0, 500.0)  # smallest, largest marker area: the fastest and the slowest optimizer
# Peak-memory parts, bottom to top, with their colours (not the optimizers' colours: these are parts).
MEMORY_PARTS = [("weights_mib", "weights", "#4c72b0"), ("grads_mib", "grads", "#8fb0d8"), ("state_mib",
                "optimizer state", "#dd8452"), ("other_mib_clipped", "rest (activations, temporaries)", "#c7c7c7")]
MODULE_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3")


def _peak_basis(trials: pd.DataFrame, job: str) -> str:
    cuda = trials.loc[trials["job"] == job, "peak_cuda_allocated_bytes"].notna().any()
    return "CUDA peak allocated" if cuda else "weights + peak RSS growth (CPU)"


def _fidelity_note(trials: pd.DataFrame, job: str) -> str:
    fidelity = trials.loc[(trials["job"] == job) & (trials["status"] == "ok"), "fidelity"].fillna(False).astype(bool)
    return "\nfidelity runs: peaks include the shadow fp32 AdamW" if fidelity.any() else ""


NOT_SHOWN_LINES, NOT_SHOWN_CHARS = 4, 100  # a panel title's lines and their width at its font size
# a curve panel's legend: entries that fit inside it; else beside it, this many a column, each column this wide
LEGEND_INSIDE, LEGEND_ROWS, LEGEND_COLUMN_IN = 12, 24, 2.0


def _not_shown(summary: pd.DataFrame, job: str) -> str:
    """The job's optimizers the trade-off leaves out, as title lines: those that did not end ok, and those at chance
    (no quality figure from a job that did not train). At most NOT_SHOWN_LINES, the rest counted: a registry sweep
    at 8 steps left 40 out, and their names on one 766-character line squeezed the panels to nothing."""
    rows = summary[summary["job"] == job]
    names = [f"{r.optimizer} ({r.status if r.status != 'ok' else cells.UNTRAINED})"
             for r in rows.drop(index=_trained(rows).index).itertuples()]
    lines: list[str] = []
    for kept in range(len(names), 0, -1):
        more = len(names) - kept
        lines = textwrap.wrap("not shown: " + ", ".join(names[:kept])
                              + (f" and {more} more (the tables list them)" if more else ""), NOT_SHOWN_CHARS)
        if len(lines) <= NOT_SHOWN_LINES:
            break
    return "\n".join(lines)


def _trained(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows that ended ok and trained: what the trade-off can place on a quality axis."""
    ok = rows[rows["status"] == "ok"]
    return ok[cells.trained(ok)]


def _marker_areas(step_ms: pd.Series) -> pd.Series:
    """Marker area grows linearly with step time, so a point twice as slow has twice the ink."""
    finite = step_ms[step_ms.notna()]
    if finite.empty:
        return pd.Series(MARKER_AREA_PT2[0], index=step_ms.index)
    low, high = MARKER_AREA_PT2
    return (step_ms.fillna(finite.min()) / finite.max() * high).clip(lower=low)


def _spread(value: object) -> float | None:
    """An error-bar half-width, or None when there is nothing to draw (one seed, or identical seeds)."""
    return float(value) if stats.is_finite(value) and float(value) > 0 else None


def label_offsets(xs: Sequence[float], ys: Sequence[float], near_x: float = 0.25, near_y: float = 0.08
                  ) -> list[tuple[int, int]]:
    """Label offsets in points: up-right by default, turning to the next free corner for each earlier point
    within `near_x` / `near_y` of the axis span (labels are wide, so x counts as near from further away);
    labels of nearly equal points then do not overlap. The x span runs from 0, as the memory axes do."""
    x_span = ((max(xs) - min(0.0, min(xs))) or 1.0) if xs else 1.0
    y_span = ((max(ys) - min(ys)) or 1.0) if ys else 1.0
    corners = [(9, 6), (9, -24), (-9, 6), (-9, -24)]
    offsets = []
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        crowd = sum(abs(x - xs[j]) / x_span < near_x and abs(y - ys[j]) / y_span < near_y for j in range(i))
        offsets.append(corners[crowd % len(corners)])
    return offsets


def _tradeoff_panel(ax, ok: pd.DataFrame, x: str, xlabel: str, areas: pd.Series) -> None:
    if ok.empty:  # every trial of this job failed, diverged, was skipped or stayed at chance: the title lists them
        ax.text(0.5, 0.5, "no trial of this job ended ok and trained", transform=ax.transAxes, ha="center",
                va="center")
        ax.set_xlabel(xlabel)
        return
    y = "eval_target"
    points = ok[ok[x].map(stats.is_finite) & ok[y].map(stats.is_finite)]
    ylabel, mode = metric_label(ok)
    offsets = label_offsets(points[x].tolist(), points[y].tolist())
    for row, (dx, dy) in zip(points.itertuples(), offsets, strict=True):
        colour = optimizer_colour(row.optimizer)
        ax.errorbar(getattr(row, x), getattr(row, y), xerr=_spread(getattr(row, x + "_ci")),
                    yerr=_spread(getattr(row, y + "_ci")), fmt="none", ecolor=colour, capsize=4, lw=1.2)
        ax.scatter(getattr(row, x), getattr(row, y), s=areas[row.Index], color=colour, alpha=0.75,
                   edgecolors="black", linewidths=0.6, zorder=4 - areas[row.Index] / 1e4)  # small on top
        step = f"\n{row.step_ms:,.0f} ms/step" if stats.is_finite(row.step_ms) else ""
        ax.annotate(f"{row.optimizer}{step}", (getattr(row, x), getattr(row, y)), xytext=(dx, dy),
                    textcoords="offset points", fontsize=8.5, ha="left" if dx > 0 else "right")
    if len(points) > 1:
        sign = 1.0 if mode == "max" else -1.0  # the front wants "better" as larger
        front = pareto.pareto_front(points[x].tolist(), (sign * points[y]).tolist())
        xs, ys = points[x].iloc[front], points[y].iloc[front]
        ax.step(xs, ys, where="post", ls="--", color="black", lw=1, alpha=0.6, label="Pareto front", zorder=1)
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    right = (points[x] + points[x + "_ci"].astype(float).fillna(0)).max() if len(points) else float("nan")
    ax.set_xlim(left=0, right=max(right * 1.2, 1e-3) if stats.is_finite(right) else None)
    ax.margins(y=0.25)
    ax.grid(alpha=0.3)


def plot_tradeoff(trials: pd.DataFrame, summary: pd.DataFrame, path: Path) -> Path:
    """Eval metric against state memory (left) and peak training memory (right), 95 % CI error bars."""
    areas = _marker_areas(summary.loc[summary["status"] == "ok", "step_ms"])
    fig, panels = job_panels(summary, 2)
    for axes, job, rows in panels:
        ok = _trained(rows)
        _tradeoff_panel(axes[0], ok, "state_mib", "optimizer state (MiB)", areas)
        _tradeoff_panel(axes[1], ok, "peak_memory_mib", f"peak training memory (MiB): {_peak_basis(trials, job)}",
                        areas)
        missing = _not_shown(summary, job)
        axes[0].set_title(job + (f"\n{missing}" if missing else ""), fontsize=9, loc="left")
        axes[1].set_title("same runs, whole training footprint" + _fidelity_note(trials, job), fontsize=9, loc="left")
    return save_titled(fig, "Eval metric vs memory per optimizer (mean ± 95 % CI over seeds; left is better; "
                       "marker area ∝ median step time)", path)


def _curve_panel(ax, trials: pd.DataFrame, column: str, ylabel: str, median_column: str | None = None) -> None:
    for optimizer, group in trials.groupby("optimizer", sort=False):
        curves = [c for c in group[column] if isinstance(c, list) and c]
        if not curves:
            continue
        mean, std = mean_band(curves)
        steps = np.arange(1, len(mean) + 1)
        label = f"{optimizer} ({len(curves)} seed{'s' if len(curves) > 1 else ''})"
        if median_column is not None and group[median_column].map(stats.is_finite).any():
            label += f", median {group[median_column].astype(float).mean():.4g}"
        colour = optimizer_colour(str(optimizer))
        ax.plot(steps, mean, color=colour, label=label, **optimizer_line(str(optimizer)))
        ax.fill_between(steps, mean - std, mean + std, color=colour, alpha=0.2, lw=0)
    ax.set_xlabel("optimizer step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    labels = ax.get_legend_handles_labels()[1]
    if len(labels) > LEGEND_INSIDE:  # inside, 41 entries squeezed the axes to nothing: beside them, in columns,
        columns = math.ceil(len(labels) / LEGEND_ROWS)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), ncol=columns)
        figure, panels = ax.get_figure(), ax.get_subplotspec().get_gridspec().ncols
        figure.set_figwidth(max(figure.get_figwidth(), panels * (PANEL_IN[0] + LEGEND_COLUMN_IN * columns)))
    elif labels:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no per-step data in these records", transform=ax.transAxes, ha="center", color="grey")


def plot_curves(trials: pd.DataFrame, path: Path) -> Path:
    """Training loss per step, mean over seeds with a ± std band; the warm-up (lr ramp) is shaded."""
    fig, panels = job_panels(trials[trials["status"] == "ok"])
    for (ax,), job, ok in panels:
        warmup = int(ok["warmup_steps"].max() or 0)
        if warmup:
            ax.axvspan(0.5, warmup + 0.5, color="grey", alpha=0.12, label=f"warm-up ({warmup} steps)")
        _curve_panel(ax, ok, "loss_curve", "training loss (per batch)")
        ax.set_title(job, fontsize=9, loc="left")
    return save_titled(fig, "Training loss per optimizer (mean ± std over seeds)", path)


def plot_memory(trials: pd.DataFrame, summary: pd.DataFrame, path: Path) -> Path:
    """Peak memory per optimizer split into weights, grads, optimizer state and the rest (means over seeds).

    The rest is measured peak minus the three counted parts; where it comes out negative (allocator reuse
    on CPU) it is drawn as zero and a diamond marks the measured peak, so the bar never hides the gap.
    """
    ok_all = summary[summary["status"] == "ok"].copy()
    ok_all["other_mib_clipped"] = ok_all["other_peak_mib"].clip(lower=0)
    fig, panels = job_panels(ok_all)
    for (ax,), job, rows in panels:
        ok = rows.reset_index(drop=True)
        parts = [(label, ok[column].astype(float).fillna(0).to_numpy(), colour)
                 for column, label, colour in MEMORY_PARTS]
        bottom = stacked_bars(ax, ok["optimizer"], parts, "memory at peak (MiB)")
        peaks = ok["peak_memory_mib"].astype(float)
        over = peaks.notna() & (bottom > peaks.to_numpy() + 1e-9)
        if over.any():
            ax.scatter(ok["optimizer"][over], peaks[over], marker="D", color="black", zorder=3,
                       label="measured peak (below the counted parts)")
        for i, peak in enumerate(peaks):
            if stats.is_finite(peak):
                ax.annotate(f"{peak:,.0f} MiB", (i, max(peak, bottom[i])), xytext=(0, 3),
                            textcoords="offset points", ha="center", fontsize=8.5)
        top = float(np.nanmax(np.concatenate([bottom, peaks.to_numpy()]))) if len(bottom) else 0.0
        ax.set_ylim(0, top * 1.15 if top > 0 else 1)  # room for the totals printed above the bars
        ax.set_title(f"{job}\npeak = {_peak_basis(trials, job)}{_fidelity_note(trials, job)}", fontsize=9,
                     loc="left")
    return save_titled(fig, "Where peak training memory goes, per optimizer", path)


def plot_fidelity(trials: pd.DataFrame, path: Path) -> Path:
    """Each optimizer's update against fp32 AdamW's from the same state: cosine (1 = same direction) and
    relative error ‖u − u_ref‖ / ‖u_ref‖ (0 = identical), per step, mean ± std over seeds."""
    fig, panels = job_panels(carrying(trials, "update_cosine_curve"), 2)
    for axes, job, ok in panels:
        _curve_panel(axes[0], ok, "update_cosine_curve", "cosine(update, fp32 AdamW update)", "update_cosine_median")
        _curve_panel(axes[1], ok, "update_rel_error_curve", "relative error ‖u − u_ref‖ / ‖u_ref‖",
                     "update_rel_error_median")
        axes[0].set_title(job, fontsize=9, loc="left")
    return save_titled(fig, "Update fidelity against an fp32 AdamW step from the same parameters and gradients", path)


def plot_lr_sensitivity(tune: pd.DataFrame, path: Path) -> Path:
    """Mean validation metric over the tune seeds against lr per optimizer; failed or diverged points as red
    crosses on the lower edge, the chosen lr ringed (the same choice the summary makes, stats.choose_lr)."""
    choices = lr_choices(tune)
    fig, panels = job_panels(tune)
    for (ax,), job, rows in panels:
        failed_at = []
        for (job_id, optimizer), choice in choices.items():
            if job_id != rows["job_id"].iloc[0]:
                continue
            ok = [p for p in choice.points if p.value is not None]
            colour = optimizer_colour(str(optimizer))
            tun = f", tunability {choice.tunability:.2f}" if choice.tunability is not None else ""
            ax.plot([p.lr for p in ok], [p.value for p in ok], marker="o", color=colour,
                    label=f"{optimizer}{tun}", **optimizer_line(str(optimizer)))
            failed_at += [(p.lr, colour) for p in choice.points if p.value is None and p.status != "missing"]
            ax.scatter([p.lr for p in ok if p.lr == choice.lr], [p.value for p in ok if p.lr == choice.lr], s=180,
                       facecolors="none", edgecolors=colour, lw=2, zorder=5)
        if failed_at:
            low = ax.get_ylim()[0]
            ax.scatter([lr for lr, _ in failed_at], [low] * len(failed_at), marker="x", s=70, color="#c00000",
                       zorder=6, label="failed / diverged", clip_on=False)
        ax.set(xscale="log", xlabel="learning rate", ylabel=metric_label(rows, "validation")[0])
        seeds = ", ".join(map(str, sorted(set(rows["seed"].astype(int)))))
        ax.set_title(f"{job}\ntune stage: seed {seeds}, {int(rows['steps'].max())} steps", fontsize=9, loc="left")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    return save_titled(fig, "lr sensitivity: mean validation metric per lr (ringed: the lr chosen)", path)


def plot_state_modules(trials: pd.DataFrame, path: Path) -> Path:
    """Where the state bytes go: per optimizer, one bar of its optimizer state stacked by module kind
    (`state_bytes_by_module`: embeddings, attention, mlp, norms/biases, head), mean over seeds."""
    fig, panels = job_panels(carrying(trials, "state_bytes_by_module"))
    for (ax,), job, rows in panels:
        parts = pd.DataFrame(list(rows["state_bytes_by_module"]), index=rows.index).fillna(0) / MIB
        means = parts.groupby(rows["optimizer"], sort=False).mean()
        kinds = [k for k in MODULE_KINDS if k in means] + sorted(set(means.columns) - set(MODULE_KINDS))
        colours = dict(zip(kinds, [*MODULE_COLOURS, *["#999999"] * len(kinds)], strict=False))
        stacked_bars(ax, means.index.to_series(), [(k, means[k].to_numpy(), colours[k]) for k in kinds],
                     "optimizer state (MiB)")
        ax.set_title(job, fontsize=9, loc="left")
    return save_titled(fig, "Where the optimizer state bytes go, per module kind (mean over seeds)", path)


def plot_eval_vs_time(trials: pd.DataFrame, path: Path) -> Path:
    """Eval metric on the fixed eval subset against training seconds, mean over seeds with a 95 % CI band
    (x: the seeds' mean training time at each eval step); the dotted line is the job's target."""
    fig, panels = job_panels(carrying(trials, "eval_curve"))
    for (ax,), job, rows in panels:
        for optimizer, group in rows.groupby("optimizer", sort=False):
            curves = [np.asarray(c, dtype=float) for c in group["eval_curve"]]
            length = min(len(c) for c in curves)
            seconds = np.mean([c[:length, 1] for c in curves], axis=0)
            intervals = [stats.mean_ci([c[i, 2] for c in curves]) for i in range(length)]
            mean = np.array([iv.mean for iv in intervals])
            half = np.array([iv.half_width or 0.0 for iv in intervals])
            colour = optimizer_colour(str(optimizer))
            ax.plot(seconds, mean, color=colour, marker=".", label=f"{optimizer} ({len(curves)} seeds)",
                    **optimizer_line(str(optimizer)))
            ax.fill_between(seconds, mean - half, mean + half, color=colour, alpha=0.18, lw=0)
        target = rows["job_target"].dropna()
        if len(target):
            ax.axhline(float(target.iloc[0]), color="black", ls=":", lw=1, label=f"target {target.iloc[0]:.4g}")
        ax.set(xlabel="training time (s, eval excluded)", ylabel=metric_label(rows)[0])
        ax.set_title(job, fontsize=9, loc="left")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_titled(fig, "Eval metric vs training time (mean ± 95 % CI over seeds)", path)


def plot_profile(times: dict[str, dict[str, float | None]], path: Path) -> Path:
    """AlgoPerf-style performance profile: share of jobs each optimizer reaches the target within tau x the
    fastest (a job's time: the median over seeds, a missed seed counting as infinite); the legend gives the area
    under the curve (0..1)."""
    profile = pareto.performance_profile(times)
    fig, ((ax,),) = new_figure(1, 1)
    for optimizer, fractions in profile.items():
        ax.step(pareto.PROFILE_TAUS, fractions, where="post", color=optimizer_colour(optimizer),
                label=f"{optimizer} (score {pareto.profile_score(fractions):.2f})", **optimizer_line(optimizer))
    ax.set(xlabel="tau: time to target / fastest optimizer's time on that job",
           ylabel=f"share of the {len(times)} jobs within tau", ylim=(-0.02, 1.02))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return save_titled(fig, "Performance profile across jobs (higher and further left is better)", path)


FIGURES = ("tradeoff.png", "curves.png", "memory.png", "fidelity.png", "lr_sensitivity.png", "eval_vs_time.png",
           "profile.png", "state_modules.png")


def write_plots(trials: pd.DataFrame, summary: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Every figure the data supports, as PNGs in out_dir; nothing when no trial finished ok.

    Tune-stage trials feed the lr-sensitivity figure; the others show each job's finals (`trials.final`).
    A figure of an earlier report that this data does not support (say fidelity.png, now that no run used
    --fidelity) is removed, so the folder never pairs a new report.md with an old figure.
    """
    paths = []
    if not trials.empty and (trials["stage"] == "tune").any():
        paths.append(plot_lr_sensitivity(trials[trials["stage"] == "tune"], out_dir / FIGURES[4]))
    finals = trials[trials["final"]] if not trials.empty else trials
    if not finals.empty and (finals["status"] == "ok").any():
        paths += [plot_tradeoff(finals, summary, out_dir / FIGURES[0]), plot_curves(finals, out_dir / FIGURES[1]),
                  plot_memory(finals, summary, out_dir / FIGURES[2])]
        for column, plot, name in (("update_cosine_curve", plot_fidelity, FIGURES[3]),
                                   ("eval_curve", plot_eval_vs_time, FIGURES[5]),
                                   ("state_bytes_by_module", plot_state_modules, FIGURES[7])):
            if not carrying(finals, column).empty:
                paths.append(plot(finals, out_dir / name))
        times = time_to_target_by_job(summary)
        if len(times) >= 2:
            paths.append(plot_profile(times, out_dir / FIGURES[6]))
    for stale in {out_dir / name for name in FIGURES} - set(paths):
        stale.unlink(missing_ok=True)
    return paths
