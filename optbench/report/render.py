"""Render frame.py's frames: markdown, csv, json, a self-contained HTML page (html_page.py), and the terminal
summary.

Numbers are means over seeds ± the half-width of their 95 % Student-t interval ("n/a" with one seed);
failed trials get their own row with their status and message, so nothing disappears from the table.
Every column comes from the metric table (metrics.py); a column no row of a job fills is left out.
Verdicts against the reference optimizer use the words of stats.py (equivalent within ±m, better or
worse by at least m, non-inferior, inconclusive). Figures come from plots.py, imported only when written.
"""

from __future__ import annotations

import html
import json
import textwrap
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from optbench.probes import HOST_SYNCED
from optbench.records.record import REFERENCE_OPTIMIZER, Record
from optbench.report import html_page, metrics, pareto, stats
from optbench.report.bounds import UNTRAINED_POINTS
from optbench.report.cells import (
    DETECTABLE,
    band_cell,
    bound_cell,
    bound_title,
    delta_cell,
    detectable_cell,
    metric_cell,
    optional,
    present,
    short_quality,
    trained,
    tuned_lr_cell,
    verdict_phrase,
)
from optbench.report.frame import (
    MEM_SAVED,
    SPEED,
    TARGET_SHARE,
    job_id_without,
    job_label,
    summarize,
    time_to_target_by_job,
    trials_frame,
)
from optbench.report.metrics import QUALITY, QUALITY_METRIC, Metric

__all__ = ["FORMATS", "render_json", "render_markdown", "render_terminal", "summarize",
           "trials_frame", "write_report"]

FORMATS = ("md", "csv", "json", "html")
TERMINAL_WIDTH = 120
ALWAYS = ("optimizer", "weights", "state precision", "status")


def _shown(metric: Metric, target: str) -> bool:
    return metric.show and metric.hide_for_target != target


def job_table(group: pd.DataFrame) -> pd.DataFrame:
    """One job's full table: identity, study columns, every metric of the table, the columns vs adamw."""
    target = str(group["target_metric"].iloc[0])
    rows = [row for _, row in group.iterrows()]
    table = pd.DataFrame({
        "optimizer": group["optimizer"], "weights": group["weight_precision"], "state precision": group["precision"],
        "status": [f"{r.status} {r.trials}/{r.of_trials}" for r in group.itertuples()],
        "tuned lr": [tuned_lr_cell(r) for r in rows], "lr ok/grid": optional(group, "tune_points", "{}"),
        "near-tie band": [band_cell(r) for r in rows], "tunability": optional(group, "tunability", "{:.2f}"),
        **{m.title.format(metric=target): [metric_cell(r, m) for r in rows]
           for m in metrics.METRICS if _shown(m, target)},
        f"{target} Δ vs {REFERENCE_OPTIMIZER} (95% CI)": [delta_cell(r) for r in rows],
        DETECTABLE: [detectable_cell(r) for r in rows],
        MEM_SAVED: optional(group, MEM_SAVED, "{:,.1f}"), SPEED: optional(group, SPEED, "{:,.2f}"),
    })
    quality = QUALITY_METRIC.title.format(metric=target)
    if quality in table:  # the ceiling beside the metric it bounds
        table.insert(table.columns.get_loc(quality) + 1, bound_title(str(group["target_mode"].iloc[0])),
                     [bound_cell(r) for r in rows])
    empty = [c for c in table.columns if c not in ALWAYS and (table[c].astype(str) == "").all()]
    return table.drop(columns=empty)


def display_tables(summary: pd.DataFrame) -> list[tuple[str, pd.DataFrame, str, list[str]]]:
    """Per job: (job label, the formatted table, its notes, one line per failed row's error)."""
    tables = []
    for _, group in summary.groupby("job_id", sort=False):
        errors = [f"{r.optimizer} ({r.status}): {r.error}" for r in group.itertuples() if r.status != "ok" and r.error]
        tables.append((str(group["job"].iloc[0]), job_table(group), notes(group), errors))
    return tables


def notes(rows: pd.DataFrame) -> str:
    """What one job's columns were measured against: target, tuning and its band, margin, schedule, intervals."""
    first, said = rows.iloc[0], []
    metric = first["target_metric"]
    if present(first.get("job_target")) and rows.get("time_to_target_s_n", pd.Series(dtype=float)).fillna(0).sum():
        sign = ">=" if first["target_mode"] == "max" else "<="
        fixed = first.get("job_target_fixed")  # a numpy bool out of the frame: truth, not identity with True
        when = ("fixed before the runs" if present(fixed) and bool(fixed) else
                f"set after the fact: {TARGET_SHARE:g} x the best final mean (give --target to fix it)")
        said.append(f"target: {metric} {sign} {first['job_target']:.4g} on the eval curve ({when}); time to target "
                    "is the median over seeds, a seed that never reached it counting as infinite, each crossing "
                    "interpolated between the two evaluations around it (the curve's spacing is its resolution)")
    tuned = rows[rows["tune_steps"].notna()] if "tune_steps" in rows else rows[:0]
    if "tuned_lr" in tuned:  # a tuning that chose no lr (every tune trial failed) says nothing of a choice
        tuned = tuned[tuned["tuned_lr"].map(present)]
    if len(tuned):
        budget, steps = int(tuned["tune_steps"].max()), first.get("steps")
        fewer = f" (fewer than the {int(steps)} final steps)" if present(steps) and int(steps) > budget else ""
        basis = tuned["tune_band_basis"].iloc[0]
        said.append(f"lr chosen by the mean validation {metric} over {int(tuned['tune_seeds'].max())} tune seed(s) "
                    f"of {budget} steps{fewer}; lrs within the near-tie band of the best ({basis}) went to the one "
                    "nearest the grid's geometric middle")
    if "verdict_vs_adamw" in rows and rows["verdict_vs_adamw"].map(present).any():
        margin = stats.margin_text(float(first["margin"]), str(first["target_scale"]))
        said.append(f"verdicts: the paired 95 % interval of the difference to {REFERENCE_OPTIMIZER} over shared seeds "
                    f"against a margin of ±{margin}")
    if present(first.get("schedule")):
        said.append(f"lr schedule: {first['schedule']} after {int(first.get('warmup_steps') or 0)} warm-up steps")
    if rows.get("impl", pd.Series(dtype=str)).astype(str).str.contains(HOST_SYNCED).any():
        said.append(f"impl '{HOST_SYNCED}': bitsandbytes synchronises the GPU after every parameter's update, so "
                    "its optimizer step is host-serialised and its roofline % is bound by launches and waits, not "
                    "by memory bandwidth")
    said.append("± is the 95 % Student-t interval over seeds (none with one seed: n/a)")
    return "; ".join(said + bound_notes(rows)) + "."


def bound_notes(rows: pd.DataFrame) -> list[str]:
    """What the ceiling, chance and minimum detectable difference columns mean (report/bounds.py, stats.py)."""
    said = []
    first = next((row for _, row in rows.iterrows() if present(row.get("metric_chance"))), rows.iloc[0])  # ok rows'
    metric, most = first["target_metric"], first["target_mode"] == "max"
    if present(first.get("metric_ceiling")):
        said.append(f"{bound_title(first['target_mode'])}: the {metric} of the Bayes-optimal predictor on this eval "
                    "split, exact from the data's generator")
    if present(first.get("metric_chance")):
        said.append(f"chance: {metric} {first['metric_chance']:.4g} ("
                    + ("the majority class's share" if most else "the unigram perplexity of the eval tokens")
                    + f"); a final {f'at most {UNTRAINED_POINTS:g} points above it' if most else 'at or above it'} "
                    "is shown as untrained")
    if "detectable_vs_adamw" in rows and rows["detectable_vs_adamw"].map(present).any():
        said.append("min. detectable Δ: the smallest true difference the comparison would call worse by at least the "
                    "margin with 80 % power at its n, m + (t(0.975, n-1) + t(0.8, n-1)) · s_d / √n")
    return said


def render_markdown(summary: pd.DataFrame) -> str:
    """One markdown table per job, headed by the job's settings, then side-by-side and profile tables."""
    parts = [f"### {job}\n\n" + table.to_markdown(index=False) + "\n\n" + said
             + ("\n\n" + "\n".join(f"- {e}" for e in errors) if errors else "")
             for job, table, said, errors in display_tables(summary)]
    extras = [text for text in (render_side_by_side_markdown(summary), render_profile_markdown(summary)) if text]
    return "\n\n".join(parts) + "\n" + "".join("\n" + text for text in extras)


def render_side_by_side_markdown(summary: pd.DataFrame) -> str:
    """Jobs whose keys differ only in precision and/or engine, in one table: what bf16 weights, autocast or
    another training loop change for the same optimizer (each is its own job above, with its own "vs adamw")."""
    ok = summary[summary["status"] == "ok"]
    parts = []
    for side, group in ok.groupby("side_id", sort=False):
        if group["job_id"].nunique() < 2:
            continue
        target = str(group["target_metric"].iloc[0])
        order = {name: i for i, name in enumerate(dict.fromkeys(group["optimizer"]))}
        group = group.sort_values("optimizer", kind="stable", key=lambda names: names.map(order))
        table = pd.DataFrame({
            "optimizer": group["optimizer"], "weights": group["weight_precision"], "engine": group["engine"],
            "state precision": group["precision"],
            "status": [f"ok {r.trials}/{r.of_trials}" for r in group.itertuples()],
            **{m.title.format(metric=target): [metric_cell(r, m) for _, r in group.iterrows()]
               for m in metrics.METRICS if m.compact}})
        table = table.drop(columns=[c for c in ("weights", "engine") if table[c].nunique() < 2])
        parts.append(f"### Side by side: {job_label(json.loads(side))}\n\n" + table.to_markdown(index=False) + "\n")
    return "\n".join(parts)


def render_profile_markdown(summary: pd.DataFrame) -> str:
    """Across >= 2 jobs: each optimizer's performance-profile score (area under it, 0..1)."""
    times = time_to_target_by_job(summary)
    if len(times) < 2:
        return ""
    profile = pareto.performance_profile(times)
    rows = pd.DataFrame({"optimizer": list(profile),
                         "profile score (0-1)": [round(pareto.profile_score(v), 3) for v in profile.values()],
                         "jobs reaching target": [f"{sum(stats.is_finite(t.get(n)) for t in times.values())}"
                                                  f"/{len(times)}" for n in profile]})
    return ("### Across jobs: performance profile of time to target (tau from 1 to 4; median over seeds, "
            "a missed seed counting as infinite)\n\n"
            + rows.sort_values("profile score (0-1)", ascending=False).to_markdown(index=False) + "\n")


def render_json(summary: pd.DataFrame) -> str:
    """The numeric summary as a JSON array of rows (NaN as null), for scripts and dashboards."""
    return summary.to_json(orient="records", indent=1, force_ascii=False) + "\n"


def _first_to_target(group: pd.DataFrame) -> str | None:
    """The sentence on the fastest median time to target among the optimizers that reached it on every seed (one
    that missed on any seed is never called first, nor one whose every seed ended at chance: a target it met is
    no quality figure); a lead no larger than the eval curve's resolution is no lead."""
    if "time_to_target_s_n" not in group:
        return None
    n = group["time_to_target_s_n"].fillna(0)
    reached = group[(n > 0) & (group["time_to_target_s_reached"] == n) & trained(group)]
    times = reached["time_to_target_s"].astype(float).sort_values()
    spacing = pd.to_numeric(reached.get("time_to_target_s_resolution"), errors="coerce").max()
    if len(times) > 1 and present(spacing) and times.iloc[1] - times.iloc[0] <= spacing:
        tied = ", ".join(str(reached.loc[i, "optimizer"]) for i in times.index if times[i] - times.iloc[0] <= spacing)
        return f"no first to the target: {tied} reach it within the eval curve's {spacing:,.1f} s resolution"
    return (f"first to the target on every seed: {reached.loc[times.index[0], 'optimizer']} (median "
            f"{times.iloc[0]:,.1f} s)") if len(times) else None


def verdict_sentences(group: pd.DataFrame) -> list[str]:
    """Plain-text sentences about one job's ok rows: memory, speed, first to target, verdicts vs adamw."""
    metric, mode, said = str(group["target_metric"].iloc[0]), str(group["target_mode"].iloc[0]), []
    scored = group[group["eval_target"].notna() & group["peak_memory_mib"].notna() & trained(group)]
    if len(scored) and mode == "max":
        best = scored.loc[(scored["eval_target"] / scored["peak_memory_mib"]).idxmax()]
        said.append(f"most {metric} per MiB of peak training memory: {best['optimizer']} "
                    f"({best['eval_target']:.4g} at {best['peak_memory_mib']:,.0f} MiB)")
    elif len(scored):
        best = scored.loc[scored["peak_memory_mib"].idxmin()]
        said.append(f"smallest peak training memory: {best['optimizer']} ({best['peak_memory_mib']:,.0f} MiB, "
                    f"{metric} {best['eval_target']:.4g})")
    timed = group[group["step_ms"].notna()]
    if len(timed):
        fast = timed.loc[timed["step_ms"].idxmin()]
        said.append(f"fastest step: {fast['optimizer']} ({fast['step_ms']:,.0f} ms)")
    said += [sentence for sentence in [_first_to_target(group)] if sentence]
    by_verdict: dict[str, list[str]] = {}  # one sentence per verdict, naming every optimizer it holds for
    for _, r in group.iterrows():
        if verdict_phrase(r):
            by_verdict.setdefault(verdict_phrase(r), []).append(str(r["optimizer"]))
    return said + [f"{', '.join(names)} vs {REFERENCE_OPTIMIZER} on {metric}: {verdict}"
                   for verdict, names in by_verdict.items()]


def verdict_lines(summary: pd.DataFrame) -> list[str]:
    """One HTML line per job for people: the job in bold, then its verdict sentences."""
    return [f"<b>{html.escape(str(group['job'].iloc[0]))}</b>: "
            + html.escape("; ".join(verdict_sentences(group))) + "."
            for _, group in summary[summary["status"] == "ok"].groupby("job_id", sort=False)]


# --- the terminal summary ------------------------------------------------------------------------------------

def _words(row: pd.Series, ref: pd.Series | None) -> str:
    """One optimizer in words: target metric vs the reference and its verdict, memory saved, speed ratio."""
    if row["status"] != "ok":
        return f"{row['optimizer']}: {row['status']}" + (f" ({row['error']})" if present(row.get("error")) else "")
    metric = QUALITY_METRIC.title.format(metric=row["target_metric"])
    said = [f"{metric} {metric_cell(row, QUALITY_METRIC)}"]
    if present(row.get("metric_ceiling")):
        said[0] += f" ({bound_title(row['target_mode'])} {row['metric_ceiling']:.4g})"
    if row["optimizer"] == REFERENCE_OPTIMIZER:
        said[0] += " (the reference)"
    elif ref is not None:
        said[0] += f" vs {REFERENCE_OPTIMIZER} {short_quality(ref)}" if present(ref.get("eval_target")) else ""
        said += [f"Δ {delta_cell(row)}"] if present(row.get("delta_vs_adamw")) or row.get("delta_untrained") else []
        said += [f"{DETECTABLE} {detectable_cell(row)}"] if present(row.get("detectable_vs_adamw")) else []
        saved = row.get(MEM_SAVED)
        said += [f"memory {'saved' if saved >= 0 else 'added'} {abs(saved):.1f} % vs {REFERENCE_OPTIMIZER}"
                 ] if present(saved) else []
        said += [f"speed {row[SPEED]:.2f}x {REFERENCE_OPTIMIZER}"] if present(row.get(SPEED)) else []
    return f"{row['optimizer']}: " + "; ".join(said)


def _compact_table(group: pd.DataFrame) -> str:
    """The job's compact table, columns dropped from the right until every line fits TERMINAL_WIDTH."""
    target = str(group["target_metric"].iloc[0])
    rows = [row for _, row in group.iterrows()]
    compact = sorted((m for m in metrics.METRICS if m.compact), key=lambda m: m.gate != QUALITY)  # quality first
    table = pd.DataFrame({"optimizer": group["optimizer"],
                          "status": [f"{r.status} {r.trials}/{r.of_trials}" for r in group.itertuples()],
                          **{m.title.format(metric=target): [metric_cell(r, m) for r in rows] for m in compact[:1]},
                          f"Δ vs {REFERENCE_OPTIMIZER}": [delta_cell(r, words=False) for r in rows],
                          **{m.title.format(metric=target): [metric_cell(r, m) for r in rows] for m in compact[1:]}})
    table = table.drop(columns=[c for c in table.columns[2:] if (table[c] == "").all()])
    text = table.to_markdown(index=False)
    while max(map(len, text.splitlines())) > TERMINAL_WIDTH and table.shape[1] > 2:
        table = table.iloc[:, :-1]
        text = table.to_markdown(index=False)
    return text


def render_terminal(summary: pd.DataFrame | Iterable[Record], margin: float | None = None) -> str:
    """What a run ends with: per job, one line per optimizer in words, then a compact table; no line is wider
    than TERMINAL_WIDTH (the full table goes to report.md). Takes a summary, or records to summarise with
    `margin` (frame.summarize)."""
    if not isinstance(summary, pd.DataFrame):
        summary = summarize(trials_frame(summary), margin)
    wrap = textwrap.TextWrapper(width=TERMINAL_WIDTH, subsequent_indent="    ", break_long_words=True)
    parts = []
    for _, group in summary.groupby("job_id", sort=False):
        ref = group[(group["optimizer"] == REFERENCE_OPTIMIZER) & (group["status"] == "ok")]
        lines = wrap.wrap(str(group["job"].iloc[0]))
        for _, row in group.iterrows():
            lines += wrap.wrap(_words(row, ref.iloc[0] if len(ref) else None))
        lines.append(_compact_table(group))
        lines += wrap.wrap(notes(group))
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


# --- the files ----------------------------------------------------------------------------------------


SIZE_FIELDS = ("model", "workload_options")  # what the jobs of a scaling sweep (`run --scale`) differ in


def _spans_model_sizes(trials: pd.DataFrame) -> bool:
    """True for a scaling sweep: jobs that differ in the model's size alone, with some optimizer's ok trials at two
    or more parameter counts. Files of unrelated jobs (another dataset's head, bf16 weights) are no sweep: a fit
    across them printed NaN slopes and exponents."""
    ok = trials[trials["status"] == "ok"] if not trials.empty else trials
    if not len(ok) or len({job_id_without(key, SIZE_FIELDS) for key in ok["job_key"]}) > 1:
        return False
    return bool((ok.groupby("optimizer")["num_params"].nunique() >= 2).any())


def write_report(records: list[Record], out_dir: Path, fmt: str = "md", figures: bool = True,
                 margin: float | None = None, summary: pd.DataFrame | None = None) -> tuple[str, list[Path]]:
    """Write report.md, summary.csv and the figures (and report.html for fmt html) into out_dir.

    Returns (the report rendered in `fmt`, the paths written); report.md and summary.csv come first.
    `margin`: the verdicts' margin (frame.summarize); `summary`: the records' summary where the caller has it
    already (it is not computed twice).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown report format '{fmt}'; known: {', '.join(FORMATS)}")
    trials = trials_frame(records)
    summary = summarize(trials, margin) if summary is None else summary
    markdown = render_markdown(summary)
    scaling = _spans_model_sizes(trials)
    if scaling:
        from optbench.report import scaling as scaling_fit

        markdown += "\n" + scaling_fit.render_scaling_markdown(trials)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "report.md", out_dir / "summary.csv"]
    paths[0].write_text(markdown, encoding="utf-8")
    summary.to_csv(paths[1], index=False)
    if figures:
        from optbench.report.plots import write_plots

        paths += write_plots(trials, summary, out_dir)
        if scaling:
            paths.append(scaling_fit.plot_scaling(trials, out_dir / scaling_fit.FIGURE_NAME))
    text = {"md": lambda: markdown, "csv": lambda: summary.to_csv(index=False), "json": lambda: render_json(summary),
            "html": lambda: html_page.render_html(verdict_lines(summary), display_tables(summary),
                                                  [p for p in paths if p.suffix == ".png"],
                                                  render_profile_markdown(summary))}[fmt]()
    if fmt == "html":
        paths.append(out_dir / "report.html")
        paths[-1].write_text(text, encoding="utf-8")
    return text, paths
