"""The report's figures: the memory-metric trade-off, loss curves, the peak-memory split, update fidelity, and
for studies the lr sensitivity, the eval metric against training time and the cross-job performance profile.

Figures are drawn on matplotlib `Figure` objects with the Agg canvas, never through pyplot, so they
render headless (CI, ssh) and leave no global state behind. This module is imported only when the
report writes figures, so the table-only paths never pay for matplotlib.

Inputs are report.py's frames: `trials` (one row per trial, with curves) and `summary` (one row per
job x optimizer x status, means, stds and 95 % CI half-widths over seeds). One row of panels per job.
Error bars and bands are 95 % Student-t intervals (stats.py); a single seed draws none.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from optbench import stats
from optbench.optimizers import REGISTRY

DPI = 130
PANEL_IN = (6.4, 4.6)  # width, height of one panel in inches
MARKER_AREA_PT2 = (40.0, 500.0)  # smallest, largest marker area: the fastest and the slowest optimizer
# Peak-memory parts, bottom to top, with their colours (not the optimizers' colours: these are parts).
MEMORY_PARTS = [("weights_mib", "weights", "#4c72b0"), ("grads_mib", "grads", "#8fb0d8"),
                ("state_mib", "optimizer state", "#dd8452"), ("other_mib_clipped", "rest (activations, temporaries)",
                                                             "#c7c7c7")]


def pareto_front(memory: Sequence[float], accuracy: Sequence[float]) -> list[int]:
    """Indices of the points no other point beats on both axes (less or equal memory and higher or equal
    accuracy, strictly better on one), ordered by memory. Ties on both axes keep the first point."""
    points = list(zip(memory, accuracy, strict=True))

    def beaten(i: int) -> bool:
        x, y = points[i]
        return any((xj <= x and yj >= y and (xj < x or yj > y)) or ((xj, yj) == (x, y) and j < i)
                   for j, (xj, yj) in enumerate(points) if j != i)

    return sorted((i for i in range(len(points)) if not beaten(i)), key=lambda i: points[i])


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


def _figure(rows: int, cols: int) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(PANEL_IN[0] * cols, PANEL_IN[1] * rows), dpi=DPI, layout="constrained")
    axes = np.atleast_2d(fig.subplots(rows, cols, squeeze=False))
    return fig, axes


def _jobs(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["job"]))


def _finite(value: object) -> bool:
    return value is not None and not pd.isna(value) and math.isfinite(float(value))


def _peak_basis(trials: pd.DataFrame, job: str) -> str:
    rows = trials[trials["job"] == job]
    if rows["peak_cuda_allocated_bytes"].notna().any():
        return "CUDA peak allocated"
    return "weights + peak RSS growth (CPU)"


def _fidelity_note(trials: pd.DataFrame, job: str) -> str:
    rows = trials[(trials["job"] == job) & (trials["status"] == "ok")]
    if "fidelity" in rows and rows["fidelity"].fillna(False).astype(bool).any():
        return "\nfidelity runs: peaks include the shadow fp32 AdamW"
    return ""


def _not_shown(summary: pd.DataFrame, job: str) -> str:
    failed = summary[(summary["job"] == job) & (summary["status"] != "ok")]
    return ", ".join(f"{r.optimizer} ({r.status})" for r in failed.itertuples())


def _marker_areas(step_ms: pd.Series) -> pd.Series:
    """Marker area grows linearly with step time, so a point twice as slow has twice the ink."""
    finite = step_ms[step_ms.notna()]
    if finite.empty:
        return pd.Series(MARKER_AREA_PT2[0], index=step_ms.index)
    low, high = MARKER_AREA_PT2
    return (step_ms.fillna(finite.min()) / finite.max() * high).clip(lower=low)


def _spread(value: object) -> float | None:
    """An error-bar half-width, or None when there is nothing to draw (one seed, or identical seeds)."""
    return float(value) if _finite(value) and float(value) > 0 else None


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


def _metric_label(frame: pd.DataFrame, prefix: str = "eval") -> tuple[str, str]:
    """(axis label, mode) for the job's target metric as the records name it."""
    metric = frame["target_metric"].dropna().iloc[0] if "target_metric" in frame and frame[
        "target_metric"].notna().any() else "accuracy"
    mode = frame["target_mode"].dropna().iloc[0] if "target_mode" in frame and frame[
        "target_mode"].notna().any() else "max"
    return f"{prefix} {metric} ({'higher' if mode == 'max' else 'lower'} is better)", mode


def _tradeoff_panel(ax, ok: pd.DataFrame, x: str, xlabel: str, areas: pd.Series) -> None:
    y = "eval_target"
    points = ok[ok[x].map(_finite) & ok[y].map(_finite)]
    ylabel, mode = _metric_label(ok)
    offsets = label_offsets(points[x].tolist(), points[y].tolist())
    for row, (dx, dy) in zip(points.itertuples(), offsets, strict=True):
        colour = optimizer_colour(row.optimizer)
        ax.errorbar(getattr(row, x), getattr(row, y), xerr=_spread(getattr(row, x + "_ci")),
                    yerr=_spread(getattr(row, y + "_ci")), fmt="none", ecolor=colour, capsize=4, lw=1.2)
        ax.scatter(getattr(row, x), getattr(row, y), s=areas[row.Index], color=colour, alpha=0.75,
                   edgecolors="black", linewidths=0.6, zorder=4 - areas[row.Index] / 1e4)  # small on top
        step = f"\n{row.step_ms:,.0f} ms/step" if _finite(row.step_ms) else ""
        ax.annotate(f"{row.optimizer}{step}", (getattr(row, x), getattr(row, y)), xytext=(dx, dy),
                    textcoords="offset points", fontsize=8.5, ha="left" if dx > 0 else "right")
    if len(points) > 1:
        sign = 1.0 if mode == "max" else -1.0  # the front wants "better" as larger
        front = pareto_front(points[x].tolist(), (sign * points[y]).tolist())
        xs, ys = points[x].iloc[front], points[y].iloc[front]
        ax.step(xs, ys, where="post", ls="--", color="black", lw=1, alpha=0.6, label="Pareto front", zorder=1)
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    right = (points[x] + points[x + "_ci"].astype(float).fillna(0)).max() if len(points) else float("nan")
    ax.set_xlim(left=0, right=max(right * 1.2, 1e-3) if _finite(right) else None)
    ax.margins(y=0.25)
    ax.grid(alpha=0.3)


def plot_tradeoff(trials: pd.DataFrame, summary: pd.DataFrame, path: Path) -> Path:
    """Eval metric against state memory (left) and peak training memory (right), 95 % CI error bars."""
    jobs = _jobs(summary)
    fig, axes = _figure(len(jobs), 2)
    ok_all = summary[summary["status"] == "ok"]
    areas = _marker_areas(ok_all["step_ms"])
    for row, job in enumerate(jobs):
        ok = ok_all[ok_all["job"] == job]
        _tradeoff_panel(axes[row, 0], ok, "state_mib", "optimizer state (MiB)", areas)
        _tradeoff_panel(axes[row, 1], ok, "peak_memory_mib",
                        f"peak training memory (MiB): {_peak_basis(trials, job)}", areas)
        missing = _not_shown(summary, job)
        axes[row, 0].set_title(job + (f"\nnot shown: {missing}" if missing else ""), fontsize=9, loc="left")
        axes[row, 1].set_title("same runs, whole training footprint" + _fidelity_note(trials, job), fontsize=9,
                               loc="left")
    fig.suptitle("Eval metric vs memory per optimizer (mean ± 95 % CI over seeds; left is better; "
                 "marker area ∝ median step time)", fontsize=11)
    fig.savefig(path)
    return path


def _curve_panel(ax, trials: pd.DataFrame, column: str, ylabel: str, median_column: str | None = None) -> None:
    for optimizer, group in trials.groupby("optimizer", sort=False):
        curves = [c for c in group[column] if isinstance(c, list) and c]
        if not curves:
            continue
        mean, std = mean_band(curves)
        steps = np.arange(1, len(mean) + 1)
        label = f"{optimizer} ({len(curves)} seed{'s' if len(curves) > 1 else ''})"
        if median_column is not None and group[median_column].map(_finite).any():
            label += f", median {group[median_column].astype(float).mean():.4g}"
        colour = optimizer_colour(str(optimizer))
        ax.plot(steps, mean, color=colour, label=label, **optimizer_line(str(optimizer)))
        ax.fill_between(steps, mean - std, mean + std, color=colour, alpha=0.2, lw=0)
    ax.set_xlabel("optimizer step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no per-step data in these records", transform=ax.transAxes, ha="center", color="grey")


def plot_curves(trials: pd.DataFrame, path: Path) -> Path:
    """Training loss per step, mean over seeds with a ± std band; the warm-up (lr ramp) is shaded."""
    ok_all = trials[trials["status"] == "ok"]
    jobs = _jobs(ok_all)
    fig, axes = _figure(len(jobs), 1)
    for row, job in enumerate(jobs):
        ok, ax = ok_all[ok_all["job"] == job], axes[row, 0]
        warmup = int(ok["warmup_steps"].max() or 0)
        if warmup:
            ax.axvspan(0.5, warmup + 0.5, color="grey", alpha=0.12, label=f"warm-up ({warmup} steps)")
        _curve_panel(ax, ok, "loss_curve", "training loss (per batch)")
        ax.set_title(job, fontsize=9, loc="left")
    fig.suptitle("Training loss per optimizer (mean ± std over seeds)", fontsize=11)
    fig.savefig(path)
    return path


def plot_memory(trials: pd.DataFrame, summary: pd.DataFrame, path: Path) -> Path:
    """Peak memory per optimizer split into weights, grads, optimizer state and the rest (means over seeds).

    The rest is measured peak minus the three counted parts; where it comes out negative (allocator reuse
    on CPU) it is drawn as zero and a diamond marks the measured peak, so the bar never hides the gap.
    """
    ok_all = summary[summary["status"] == "ok"].copy()
    ok_all["other_mib_clipped"] = ok_all["other_peak_mib"].clip(lower=0)
    jobs = _jobs(ok_all)
    fig, axes = _figure(len(jobs), 1)
    for row, job in enumerate(jobs):
        ok, ax = ok_all[ok_all["job"] == job].reset_index(drop=True), axes[row, 0]
        bottom = np.zeros(len(ok))
        for column, label, colour in MEMORY_PARTS:
            heights = ok[column].astype(float).fillna(0).to_numpy()
            ax.bar(ok["optimizer"], heights, bottom=bottom, color=colour, label=label, edgecolor="white", lw=0.5)
            bottom += heights
        peaks = ok["peak_memory_mib"].astype(float)
        over = peaks.notna() & (bottom > peaks.to_numpy() + 1e-9)
        if over.any():
            ax.scatter(ok["optimizer"][over], peaks[over], marker="D", color="black", zorder=3,
                       label="measured peak (below the counted parts)")
        for i, peak in enumerate(peaks):
            if _finite(peak):
                ax.annotate(f"{peak:,.0f} MiB", (i, max(peak, bottom[i])), xytext=(0, 3),
                            textcoords="offset points", ha="center", fontsize=8.5)
        ax.set_ylabel("memory at peak (MiB)")
        top = float(np.nanmax(np.concatenate([bottom, peaks.to_numpy()]))) if len(bottom) else 0.0
        ax.set_ylim(0, top * 1.15 if top > 0 else 1)  # room for the totals printed above the bars
        ax.set_title(f"{job}\npeak = {_peak_basis(trials, job)}{_fidelity_note(trials, job)}", fontsize=9,
                     loc="left")
        handles, labels = ax.get_legend_handles_labels()  # top of the stack first, as the bars read
        ax.legend(handles[::-1], labels[::-1], fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Where peak training memory goes, per optimizer", fontsize=11)
    fig.savefig(path)
    return path


def has_fidelity(trials: pd.DataFrame) -> bool:
    """True when some ok trial carries per-step update fidelity (`run --fidelity`)."""
    if "update_cosine_curve" not in trials:
        return False
    ok = trials[trials["status"] == "ok"]
    return any(isinstance(c, list) and any(v is not None for v in c) for c in ok["update_cosine_curve"])


def plot_fidelity(trials: pd.DataFrame, path: Path) -> Path:
    """Each optimizer's update against fp32 AdamW's from the same state: cosine (1 = same direction) and
    relative error ‖u − u_ref‖ / ‖u_ref‖ (0 = identical), per step, mean ± std over seeds."""
    ok_all = trials[trials["status"] == "ok"]
    ok_all = ok_all[ok_all["update_cosine_curve"].map(lambda c: isinstance(c, list) and len(c) > 0)]
    jobs = _jobs(ok_all)
    fig, axes = _figure(len(jobs), 2)
    for row, job in enumerate(jobs):
        ok = ok_all[ok_all["job"] == job]
        _curve_panel(axes[row, 0], ok, "update_cosine_curve", "cosine(update, fp32 AdamW update)",
                     "update_cosine_median")
        _curve_panel(axes[row, 1], ok, "update_rel_error_curve", "relative error ‖u − u_ref‖ / ‖u_ref‖",
                     "update_rel_error_median")
        axes[row, 0].set_title(job, fontsize=9, loc="left")
    fig.suptitle("Update fidelity against an fp32 AdamW step from the same parameters and gradients",
                 fontsize=11)
    fig.savefig(path)
    return path


def plot_lr_sensitivity(tune: pd.DataFrame, path: Path) -> Path:
    """Validation metric against lr per optimizer (tune stage); failed or diverged points as red crosses
    on the lower edge, the chosen lr ringed (study.choose_lr on the same records)."""
    from optbench.results import Record
    from optbench.study import choice_from_records

    jobs = _jobs(tune)
    fig, axes = _figure(len(jobs), 1)
    for row, job in enumerate(jobs):
        ax, rows = axes[row, 0], tune[tune["job"] == job]
        ylabel, _ = _metric_label(rows, "validation")
        failed_at = []
        for optimizer, group in rows.groupby("optimizer", sort=False):
            records = [Record.from_dict(r) for r in group.to_dict("records")]
            choice = choice_from_records(str(optimizer), sorted(set(group["lr"].astype(float))), records,
                                         int(group["steps"].max()))
            ok = [p for p in choice.points if p.value is not None]
            colour = optimizer_colour(str(optimizer))
            tun = f", tunability {choice.tunability:.2f}" if choice.tunability is not None else ""
            ax.plot([p.lr for p in ok], [p.value for p in ok], marker="o", color=colour,
                    label=f"{optimizer}{tun}", **optimizer_line(str(optimizer)))
            failed_at += [(p.lr, colour) for p in choice.points if p.value is None]
            if choice.lr is not None:
                best = next(p for p in ok if p.lr == choice.lr)
                ax.scatter([best.lr], [best.value], s=180, facecolors="none", edgecolors=colour, lw=2, zorder=5)
        if failed_at:
            low = ax.get_ylim()[0]
            ax.scatter([lr for lr, _ in failed_at], [low] * len(failed_at), marker="x", s=70, color="#c00000",
                       zorder=6, label="failed / diverged", clip_on=False)
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{job} (tune stage, seed 0)", fontsize=9, loc="left")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle("Learning-rate sensitivity: validation metric per grid point (ringed: the lr chosen)", fontsize=11)
    fig.savefig(path)
    return path


def has_eval_curves(trials: pd.DataFrame) -> bool:
    ok = trials[trials["status"] == "ok"]
    return "eval_curve" in ok and ok["eval_curve"].map(lambda c: isinstance(c, list) and len(c) > 0).any()


def plot_eval_vs_time(trials: pd.DataFrame, path: Path) -> Path:
    """Eval metric on the fixed eval subset against training seconds, mean over seeds with a 95 % CI band
    (x: the seeds' mean training time at each eval step); the dotted line is the job's target."""
    ok_all = trials[(trials["status"] == "ok") & trials["eval_curve"].map(lambda c: isinstance(c, list) and len(c) > 0)]
    jobs = _jobs(ok_all)
    fig, axes = _figure(len(jobs), 1)
    for row, job in enumerate(jobs):
        ax, rows = axes[row, 0], ok_all[ok_all["job"] == job]
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
        ax.set_xlabel("training time (s, eval excluded)")
        ax.set_ylabel(_metric_label(rows)[0])
        ax.set_title(job, fontsize=9, loc="left")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Eval metric vs training time (mean ± 95 % CI over seeds)", fontsize=11)
    fig.savefig(path)
    return path


def plot_profile(times: dict[str, dict[str, float | None]], path: Path) -> Path:
    """AlgoPerf-style performance profile: share of jobs each optimizer reaches the target within tau x the
    fastest; the legend gives the area under the curve (0..1)."""
    profile = stats.performance_profile(times)
    fig, axes = _figure(1, 1)
    ax = axes[0, 0]
    for optimizer, fractions in profile.items():
        ax.step(stats.PROFILE_TAUS, fractions, where="post", color=optimizer_colour(optimizer),
                label=f"{optimizer} (score {stats.profile_score(fractions):.2f})", **optimizer_line(optimizer))
    ax.set_xlabel("tau: time to target / fastest optimizer's time on that job")
    ax.set_ylabel(f"share of the {len(times)} jobs within tau")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("Performance profile across jobs (higher and further left is better)", fontsize=11)
    fig.savefig(path)
    return path


FIGURES = ("tradeoff.png", "curves.png", "memory.png", "fidelity.png", "lr_sensitivity.png", "eval_vs_time.png",
           "profile.png")


def write_plots(trials: pd.DataFrame, summary: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Every figure the data supports, as PNGs in out_dir; nothing when no trial finished ok.

    Tune-stage trials feed only the lr-sensitivity figure; the others show the final (or plain) trials.
    A figure of an earlier report that this data does not support (say fidelity.png, now that no run used
    --fidelity) is removed, so the folder never pairs a new report.md with an old figure.
    """
    from optbench.report import time_to_target_by_job

    paths = []
    tune = trials[trials["stage"] == "tune"] if "stage" in trials else trials.iloc[:0]
    finals = trials.drop(tune.index)
    if not tune.empty:
        paths.append(plot_lr_sensitivity(tune, out_dir / FIGURES[4]))
    if not finals.empty and (finals["status"] == "ok").any():
        paths += [plot_tradeoff(finals, summary, out_dir / FIGURES[0]), plot_curves(finals, out_dir / FIGURES[1]),
                  plot_memory(finals, summary, out_dir / FIGURES[2])]
        if has_fidelity(finals):
            paths.append(plot_fidelity(finals, out_dir / FIGURES[3]))
        if has_eval_curves(finals):
            paths.append(plot_eval_vs_time(finals, out_dir / FIGURES[5]))
        times = time_to_target_by_job(summary)
        if len(times) >= 2:
            paths.append(plot_profile(times, out_dir / FIGURES[6]))
    for stale in {out_dir / name for name in FIGURES} - set(paths):
        stale.unlink(missing_ok=True)
    return paths
