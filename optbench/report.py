"""Turn records into the trade-off table: one row per optimizer per job, AdamW as the reference.

Numbers are means over seeds ± the half-width of their 95 % Student-t interval ("n/a" with one seed);
failed trials get their own row with their status and message, so nothing disappears from the table. A
re-run trial (same trial_id) counts once, with its latest record. The same summary renders as markdown,
csv, json or a self-contained html page with the figures (plots.py, imported only when figures are written).

Records of a `study` add: the lr each optimizer was tuned to (recomputed from its tune records, which
are kept out of the main table), the headline metric's paired difference to AdamW with a verdict, and
time to target from the eval curves. Results spanning several jobs add a performance profile.
"""

from __future__ import annotations

import base64
import dataclasses
import html
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from optbench import stats
from optbench.results import MIB, REFERENCE_OPTIMIZER, Record, split_peak_memory

# (column in the table, how to get it from the per-trial frame, decimals)
METRICS: list[tuple[str, str, int]] = [
    ("state MiB", "state_mib", 1),
    ("state B/param", "state_bytes_per_param", 3),
    ("peak MiB", "peak_mib", 0),
    ("train mem MiB", "train_mem_mib", 0),
    ("held MiB", "held_mib", 0),
    ("step ms", "step_ms", 1),
    ("opt step ms", "opt_step_ms", 1),
    ("first step s", "first_step_s", 2),  # state creation (and compilation), kept out of the medians
    ("samples/s", "samples_per_s", 1),
    ("fp32 state %", "fp32_state_pct", 2),  # parameters whose state stays full precision
    ("roofline %", "roofline_pct", 1),  # optimizer step's memory traffic / time, as a share of copy bandwidth
    ("eval {metric}", "eval_target", 4),  # the job's target metric (accuracy, perplexity, ...)
    ("steps to target", "steps_to_target_derived", 0),
    ("time to target s", "time_to_target_derived_s", 1),
    ("eval acc", "eval_accuracy", 3),
    ("eval F1", "eval_f1", 3),
    ("update cos", "update_cosine_median", 4),  # only with `run --fidelity`; blank otherwise
]
# Averaged over seeds for the figures, not shown in the table.
FIGURE_COLUMNS = ["weights_mib", "grads_mib", "peak_memory_mib", "other_peak_mib", "update_rel_error_median"]
FORMATS = ("md", "csv", "json", "html")
RELATIVE = ["mem saved % vs adamw", "speed x vs adamw", "acc Δ pts vs adamw"]
HEADLINE = "eval_target"
TARGET_SHARE = 0.95  # default target: 95 % of the best final mean ("max"), best / 0.95 ("min")


def job_label(row: pd.Series) -> str:
    # Fidelity trials carry a shadow AdamW (its memory is in their peaks): they are a job of their own.
    fidelity = " + fidelity probe" if row.get("fidelity") is True else ""
    scratch = ", trained from scratch" if row.get("pretrained") is False else ""
    precision = row.get("precision")
    weights = f", {precision} weights" if isinstance(precision, str) and precision != "fp32" else ""
    # Another loop or a sharded run is another job: its timings and per-rank memory are not comparable.
    engine = row.get("engine")
    loop = f", {engine} engine" if isinstance(engine, str) and engine != "native" else ""
    parallel = row.get("parallel")
    sharding = (f", {parallel} x{int(row.get('world_size') or 1)}"
                if isinstance(parallel, str) and parallel != "none" else "")
    return (f"{row['model']} on {row['dataset']}{scratch}, {row['device']}, {row['steps']} steps x batch "
            f"{row['batch_size']} x seq {row['seq_len']}{weights}{loop}{sharding}{fidelity}")


def tune_key(row: pd.Series) -> tuple:
    """What a tune trial shares with the final trials it chose the lr for (steps may differ)."""
    return tuple(str(row.get(name)) for name in ("model", "dataset", "device", "batch_size", "seq_len",
                                                 "precision", "optimizer"))


def trials_frame(records: Iterable[Record]) -> pd.DataFrame:
    """One row per trial (latest record per trial_id), with derived unit columns."""
    rows = []
    for record in records:
        row = dataclasses.replace(record)  # a copy: the caller's records stay as they were read
        split_peak_memory(row)  # records from benchmark JSON or older files may lack the split
        rows.append(row.to_dict())
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame = frame.drop_duplicates("trial_id", keep="last").reset_index(drop=True)
    frame["job"] = frame.apply(job_label, axis=1)
    on_cuda = frame["peak_cuda_allocated_bytes"].notna()
    frame["state_mib"] = frame["state_bytes"] / MIB
    frame["peak_mib"] = frame["peak_cuda_allocated_bytes"].where(on_cuda, frame["peak_rss_bytes"]) / MIB
    # What training itself costs: CUDA peak allocation on GPU; growth over the post-setup RSS on CPU
    # (the process's own baseline — Python, torch, the loaded model — is the same for every optimizer).
    frame["train_mem_mib"] = frame["peak_cuda_allocated_bytes"].where(
        on_cuda, frame["peak_rss_growth_bytes"]) / MIB
    # Held after the last optimizer step (CPU): grads + state without step()'s transient temporaries.
    frame["held_mib"] = frame["rss_growth_after_step_bytes"].where(~on_cuda) / MIB
    frame["step_ms"] = frame["step_time_median_s"] * 1e3
    frame["opt_step_ms"] = frame["optimizer_step_median_s"] * 1e3
    frame["fp32_state_pct"] = 100 * _numeric(frame, "fp32_state_fraction")
    frame["roofline_pct"] = 100 * _numeric(frame, "roofline_fraction")
    frame["first_step_s"] = _numeric(frame, "first_step_s")
    _add_memory_parts(frame)
    for name in ("update_cosine_median", "update_rel_error_median"):
        frame[name] = _numeric(frame, name)
    if "stage" not in frame:
        frame["stage"] = None
    frame["eval_target"] = frame.apply(_eval_target, axis=1)
    frame["weight_precision"] = frame.apply(
        lambda r: r.get("precision") if isinstance(r.get("precision"), str) else r.get("param_dtype"), axis=1)
    _add_time_to_target(frame)
    return frame


def _eval_target(row: pd.Series) -> float | None:
    """The record's headline eval metric: eval_metrics[target_metric], or eval_accuracy for older records."""
    metrics = row.get("eval_metrics")
    metric = row.get("target_metric") or "accuracy"
    if isinstance(metrics, dict) and metrics.get(metric) is not None:
        return float(metrics[metric])
    return row.get("eval_accuracy") if metric == "accuracy" else None


def _finals(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["stage"] != "tune"]


def job_targets(frame: pd.DataFrame) -> dict[str, float]:
    """Per job: a target given with the records (`--target`), else TARGET_SHARE of the best optimizer's
    mean final metric (for a "min" metric such as perplexity: best / TARGET_SHARE)."""
    targets = {}
    for job, group in _finals(frame[frame["status"] == "ok"]).groupby("job", sort=False):
        given = pd.to_numeric(group.get("target_value"), errors="coerce").dropna()
        means = group.groupby("optimizer")["eval_target"].mean().dropna()
        if len(given):
            targets[job] = float(given.iloc[-1])
        elif len(means):
            mode = group["target_mode"].iloc[0]
            targets[job] = (means.max() * TARGET_SHARE if mode == "max" else means.min() / TARGET_SHARE)
    return targets


def reached(curve: object, target: float, mode: str) -> tuple[float, float] | None:
    """(step, training seconds) of the first eval-curve point at or beyond `target`; None if never."""
    for point in curve if isinstance(curve, list) else []:
        step, seconds, value = point[:3]
        if value is not None and (value >= target if mode == "max" else value <= target):
            return float(step), float(seconds)
    return None


def _add_time_to_target(frame: pd.DataFrame) -> None:
    """steps / seconds to the job's target per trial, from its eval curve (NaN when never reached)."""
    targets = job_targets(frame)
    steps, seconds = [], []
    for row in frame.itertuples():
        hit = None
        if row.job in targets and row.stage != "tune":
            hit = reached(getattr(row, "eval_curve", None), targets[row.job], getattr(row, "target_mode", "max"))
        steps.append(hit[0] if hit else float("nan"))
        seconds.append(hit[1] if hit else float("nan"))
    frame["steps_to_target_derived"], frame["time_to_target_derived_s"] = steps, seconds
    frame["job_target"] = frame["job"].map(targets)


def _numeric(frame: pd.DataFrame, name: str) -> pd.Series:
    """A numeric column, all-NaN when records predate the field (older results files)."""
    if name not in frame:
        return pd.Series(float("nan"), index=frame.index)
    return pd.to_numeric(frame[name], errors="coerce")


def _add_memory_parts(frame: pd.DataFrame) -> None:
    """Peak training memory and its parts in MiB (the split itself is results.split_peak_memory's)."""
    for name in ("weights", "grads", "peak_memory", "other_peak"):
        frame[f"{name}_mib"] = _numeric(frame, f"{name}_bytes") / MIB


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """Numeric summary: one row per (job, optimizer, status) of the final (non-tune) trials, with mean,
    std, 95 % CI half-width (`_ci`, None with one value) and count (`_n`) columns per metric."""
    tune = frame[frame["stage"] == "tune"]
    frame = _finals(frame)
    columns = [source for _, source, _ in METRICS] + FIGURE_COLUMNS
    rows = []
    for (job, optimizer, status), group in frame.groupby(["job", "optimizer", "status"], sort=False):
        first = group.iloc[0]
        row = {"job": job, "optimizer": optimizer, "precision": first["state_precision"],
               "weight_precision": first["weight_precision"], "status": status, "trials": len(group),
               "of_trials": int(((frame["job"] == job) & (frame["optimizer"] == optimizer)).sum()),
               "error": "; ".join(sorted({str(e) for e in group["error"].dropna()}))[:200] or None,
               "target_metric": first.get("target_metric") or "accuracy",
               "target_mode": first.get("target_mode") or "max", "job_target": first.get("job_target"),
               "lr": first.get("lr"), "engine": first.get("engine") or "native"}
        if status == "ok":
            for source in columns:
                values = pd.to_numeric(group[source], errors="coerce").dropna()
                interval = stats.mean_ci(values.tolist())
                row[source] = interval.mean if interval else None
                row[source + "_std"] = values.std() if len(values) > 1 else None
                row[source + "_ci"] = interval.half_width if interval else None
                row[source + "_n"] = len(values)
        rows.append(row)
    summary = pd.DataFrame(rows)
    if summary.empty:
        return summary
    _add_paired(frame, summary)
    _add_tuning(tune, frame, summary)
    for job in summary["job"].unique():
        ref = summary[(summary["job"] == job) & (summary["optimizer"] == REFERENCE_OPTIMIZER)
                      & (summary["status"] == "ok")]
        mask = (summary["job"] == job) & (summary["status"] == "ok")
        if ref.empty:
            continue
        ref = ref.iloc[0]
        summary.loc[mask, RELATIVE[0]] = 100 * (1 - summary.loc[mask, "train_mem_mib"] / ref["train_mem_mib"])
        summary.loc[mask, RELATIVE[1]] = ref["step_ms"] / summary.loc[mask, "step_ms"]
        summary.loc[mask, RELATIVE[2]] = 100 * (summary.loc[mask, "eval_accuracy"] - ref["eval_accuracy"])
    return summary


def _add_paired(frame: pd.DataFrame, summary: pd.DataFrame) -> None:
    """Headline metric minus AdamW's over the seeds both ran, with its interval and verdict."""
    ok = frame[frame["status"] == "ok"]
    for index, row in summary.iterrows():
        if row["status"] != "ok" or row["optimizer"] == REFERENCE_OPTIMIZER:
            continue
        job = ok[ok["job"] == row["job"]]

        def per_seed(name: str, job: pd.DataFrame = job) -> dict[int, float]:
            rows = job[(job["optimizer"] == name) & job["eval_target"].notna()]
            return dict(zip(rows["seed"].astype(int), rows["eval_target"].astype(float), strict=True))

        paired = stats.paired_difference(per_seed(row["optimizer"]), per_seed(REFERENCE_OPTIMIZER), row["target_mode"])
        if paired is not None:
            summary.loc[index, "delta_vs_adamw"] = paired.difference.mean
            summary.loc[index, "delta_vs_adamw_ci"] = paired.difference.half_width
            summary.loc[index, "delta_vs_adamw_n"] = paired.difference.n
            summary.loc[index, "verdict_vs_adamw"] = paired.verdict


def _add_tuning(tune: pd.DataFrame, finals: pd.DataFrame, summary: pd.DataFrame) -> None:
    """The lr each optimizer's tune records choose (study.choose_lr), the tune budget and tunability."""
    if tune.empty:
        return
    from optbench.study import choice_from_records

    keys = tune.apply(tune_key, axis=1)
    for index, row in summary.iterrows():
        final = finals[(finals["job"] == row["job"]) & (finals["optimizer"] == row["optimizer"])].iloc[0]
        own = tune[keys == tune_key(final)]
        if own.empty:
            continue
        records = [Record.from_dict(r) for r in own.to_dict("records")]
        steps = int(own["steps"].max())
        choice = choice_from_records(row["optimizer"], sorted(set(own["lr"].astype(float))), records, steps)
        summary.loc[index, "tuned_lr"] = choice.lr
        summary.loc[index, "tune_steps"] = steps
        summary.loc[index, "tune_points"] = f"{sum(p.status == 'ok' for p in choice.points)}/{len(choice.points)}"
        summary.loc[index, "tunability"] = choice.tunability


def time_to_target_by_job(summary: pd.DataFrame) -> dict[str, dict[str, float | None]]:
    """Mean time to target per job and optimizer (None: never reached, or the optimizer failed); jobs where
    no optimizer reached the target (or without eval curves) are left out, they rank nobody."""
    times: dict[str, dict[str, float | None]] = {}
    for row in summary.itertuples():
        value = getattr(row, "time_to_target_derived_s", None)
        per_job = times.setdefault(row.job, {})
        if row.status == "ok" or row.optimizer not in per_job:
            per_job[row.optimizer] = float(value) if value is not None and pd.notna(value) else None
    return {job: per_job for job, per_job in times.items() if any(t is not None for t in per_job.values())}


def render_profile_markdown(summary: pd.DataFrame) -> str:
    """Across >= 2 jobs: each optimizer's performance-profile score (area under it, 0..1)."""
    times = time_to_target_by_job(summary)
    if len(times) < 2:
        return ""
    profile = stats.performance_profile(times)
    rows = pd.DataFrame({"optimizer": list(profile),
                         "profile score (0-1)": [round(stats.profile_score(v), 3) for v in profile.values()],
                         "jobs reaching target": [f"{sum(t is not None for t in (times[j].get(n) for j in times))}"
                                                  f"/{len(times)}" for n in profile]})
    return ("### Across jobs: performance profile of time to target (tau from 1 to 4)\n\n"
            + rows.sort_values("profile score (0-1)", ascending=False).to_markdown(index=False) + "\n")


def _present(value: object) -> bool:
    return value is not None and not (isinstance(value, float) and pd.isna(value))


def _cell(row: pd.Series, source: str, decimals: int) -> str:
    """mean ± 95 % CI half-width; with one value the headline metric says "± n/a" and the others show the
    bare value; n shown where values are fewer than trials."""
    value = row.get(source)
    if not _present(value):
        return ""
    text = f"{value:,.{decimals}f}"
    n = row.get(source + "_n")
    if not _present(n):  # a relative column: its spread lives in the columns it is derived from
        return text
    ci = row.get(source + "_ci")
    if _present(ci):
        text += f" ± {ci:,.{decimals}f}"
    elif source == HEADLINE:  # one value: say there is no interval (a bare "± 0" would claim certainty)
        text += " ± n/a"
    return text + (f" (n={int(n)})" if int(n) < row.get("trials", n) else "")


def _paired_cell(row: pd.Series, decimals: int) -> str:
    value = row.get("delta_vs_adamw")
    if not _present(value):
        return ""
    ci = row.get("delta_vs_adamw_ci")
    if not _present(ci):
        return f"{value:+,.{decimals}f} ({row['verdict_vs_adamw']})"
    return f"{value:+,.{decimals}f} ± {ci:,.{decimals}f} (n={int(row['delta_vs_adamw_n'])}): {row['verdict_vs_adamw']}"


def _optional_column(group: pd.DataFrame, source: str, fmt: str) -> list[str] | None:
    if source not in group or not group[source].map(_present).any():
        return None
    return [fmt.format(v) if _present(v) else "" for v in group[source]]


def display_tables(summary: pd.DataFrame) -> list[tuple[str, pd.DataFrame, list[str]]]:
    """Per job: (job label, the formatted table, one line per failed row's error)."""
    tables = []
    for job, group in summary.groupby("job", sort=False):
        metric = str(group["target_metric"].iloc[0])
        study = {title: column for title, column in (
            ("tuned lr", _optional_column(group, "tuned_lr", "{:.3g}")),
            ("tune steps", _optional_column(group, "tune_steps", "{:.0f}")),
            ("lr ok/grid", _optional_column(group, "tune_points", "{}")),
            ("tunability", _optional_column(group, "tunability", "{:.2f}"))) if column is not None}
        table = pd.DataFrame({
            "optimizer": group["optimizer"],
            "weights": group["weight_precision"],
            "state precision": group["precision"],
            "status": [f"{r.status} {r.trials}/{r.of_trials}" for r in group.itertuples()],
            **study,
            **{title.format(metric=metric): [_cell(r, source, d) for _, r in group.iterrows()]
               for title, source, d in METRICS
               if not (source == "eval_accuracy" and metric == "accuracy")},  # already the headline column
            f"{metric} Δ vs adamw (95% CI)": [_paired_cell(r, 4) for _, r in group.iterrows()],
            RELATIVE[0]: [_cell(r, RELATIVE[0], 1) for _, r in group.iterrows()],
            RELATIVE[1]: [_cell(r, RELATIVE[1], 2) for _, r in group.iterrows()],
            RELATIVE[2]: [_cell(r, RELATIVE[2], 1) for _, r in group.iterrows()],
        })
        # A column no row of this job fills (F1 for a language model, fidelity without --fidelity, the
        # study's columns after a plain run) is left out rather than shown blank.
        always = ("optimizer", "weights", "state precision", "status")
        empty = [c for c in table.columns if c not in always and (table[c].astype(str) == "").all()]
        table = table.drop(columns=empty)
        errors = [f"{r.optimizer} ({r.status}): {r.error}" for r in group.itertuples()
                  if r.status != "ok" and r.error]
        tables.append((str(job), table, errors))
    return tables


def render_markdown(summary: pd.DataFrame) -> str:
    """One markdown table per job, headed by the job's settings."""
    parts = []
    for job, table, errors in display_tables(summary):
        parts.append(f"### {job}\n\n" + table.to_markdown(index=False) + _notes(summary, job)
                     + ("\n\n" + "\n".join(f"- {e}" for e in errors) if errors else ""))
    extras = [text for text in (render_side_by_side_markdown(summary), render_profile_markdown(summary)) if text]
    return "\n\n".join(parts) + "\n" + "".join("\n" + text for text in extras)


def render_side_by_side_markdown(summary: pd.DataFrame) -> str:
    """Jobs that differ only in precision or engine, in one table: what bf16 weights, autocast or another
    training loop change for the same optimizer.

    Each precision and engine is its own job above (its "vs adamw" columns compare within it); this table
    puts the same optimizer's rows next to each other.
    """
    ok = summary[summary["status"] == "ok"].copy()
    if ok.empty:
        return ""
    ok["base"] = [str(job).replace(f", {weights} weights", "").replace(f", {engine} engine", "")
                  for job, weights, engine in zip(ok["job"], ok["weight_precision"], ok["engine"], strict=True)]
    parts = []
    for base, group in ok.groupby("base", sort=False):
        if group["job"].nunique() < 2:
            continue
        metric = str(group["target_metric"].iloc[0])
        order = {name: i for i, name in enumerate(dict.fromkeys(group["optimizer"]))}
        group = group.sort_values("optimizer", kind="stable", key=lambda names: names.map(order))
        table = pd.DataFrame({
            "optimizer": group["optimizer"], "weights": group["weight_precision"], "engine": group["engine"],
            "state precision": group["precision"],
            "status": [f"ok {r.trials}/{r.of_trials}" for r in group.itertuples()],
            **{title.format(metric=metric): [_cell(r, source, d) for _, r in group.iterrows()]
               for title, source, d in METRICS
               if source in ("state_mib", "train_mem_mib", "step_ms", "opt_step_ms", HEADLINE)},
        })
        table = table.drop(columns=[c for c in ("weights", "engine") if table[c].nunique() < 2])
        parts.append(f"### Side by side: {base}\n\n" + table.to_markdown(index=False) + "\n")
    return "\n".join(parts)


def _notes(summary: pd.DataFrame, job: str) -> str:
    """What the columns were measured against: the target and the tune budget."""
    rows = summary[summary["job"] == job]
    notes = []
    target = rows["job_target"].dropna()
    curves = rows.get("steps_to_target_derived_n", pd.Series(dtype=float)).fillna(0).sum() > 0
    if len(target) and curves:
        notes.append(f"target: {rows['target_metric'].iloc[0]} {'>=' if rows['target_mode'].iloc[0] == 'max' else '<='}"
                     f" {target.iloc[0]:.4g} on the eval curve")
    if "tune_steps" in rows and rows["tune_steps"].notna().any():
        budget = int(rows["tune_steps"].max())
        steps = job.split(" steps x ")[0].rsplit(" ", 1)[-1]
        notes.append(f"lr tuned on a validation split of the training data with {budget} steps per point"
                     + (f" (fewer than the {steps} final steps)" if steps.isdigit() and int(steps) > budget else ""))
    notes.append("± is the 95 % Student-t interval over seeds (none with one seed: n/a)")
    return "\n\n" + "; ".join(notes) + "."


def render_json(summary: pd.DataFrame) -> str:
    """The numeric summary as a JSON array of rows (NaN as null), for scripts and dashboards."""
    return summary.to_json(orient="records", indent=1, force_ascii=False) + "\n"


def verdict_lines(summary: pd.DataFrame) -> list[str]:
    """A few sentences per job for people: most metric per MiB of peak memory, fastest step (and fastest to
    target), and which differences to AdamW are within the noise of the seeds."""
    lines = []
    for job, group in summary[summary["status"] == "ok"].groupby("job", sort=False):
        metric, mode = str(group["target_metric"].iloc[0]), str(group["target_mode"].iloc[0])
        said = []
        scored = group[group["eval_target"].notna() & group["peak_memory_mib"].notna()]
        if len(scored) and mode == "max":
            per_mib = scored["eval_target"] / scored["peak_memory_mib"]
            best = scored.loc[per_mib.idxmax()]
            said.append(f"most {metric} per MiB of peak training memory: <b>{html.escape(best['optimizer'])}</b> "
                        f"({best['eval_target']:.4g} at {best['peak_memory_mib']:,.0f} MiB)")
        elif len(scored):
            best = scored.loc[scored["peak_memory_mib"].idxmin()]
            said.append(f"smallest peak training memory: <b>{html.escape(best['optimizer'])}</b> "
                        f"({best['peak_memory_mib']:,.0f} MiB, {metric} {best['eval_target']:.4g})")
        timed = group[group["step_ms"].notna()]
        if len(timed):
            fast = timed.loc[timed["step_ms"].idxmin()]
            said.append(f"fastest step: <b>{html.escape(fast['optimizer'])}</b> ({fast['step_ms']:,.0f} ms)")
        reached = group[group["time_to_target_derived_s"].notna()] if "time_to_target_derived_s" in group else group[:0]
        if len(reached):
            first = reached.loc[reached["time_to_target_derived_s"].idxmin()]
            said.append(f"first to the target: <b>{html.escape(first['optimizer'])}</b> "
                        f"({first['time_to_target_derived_s']:,.1f} s)")
        if "verdict_vs_adamw" in group:
            noise = group[group["verdict_vs_adamw"] == stats.SAME]["optimizer"].tolist()
            differ = group[group["verdict_vs_adamw"].isin([stats.BETTER, stats.WORSE])]
            if noise:
                said.append(f"{metric} of {', '.join(map(html.escape, noise))} is within noise of adamw (95 % CI)")
            said += [f"{html.escape(r.optimizer)} is significantly {r.verdict_vs_adamw} than adamw on {metric}"
                     for r in differ.itertuples()]
            if group["verdict_vs_adamw"].astype(str).str.startswith("n/a").any():
                said.append("one seed only: no difference can be called significant")
        lines.append(f"<b>{html.escape(str(job))}</b>: " + "; ".join(said) + ".")
    return lines


# Click a header to sort its table by that column (numbers by their leading value), click again to reverse.
SORT_JS = """
document.querySelectorAll('table.sortable th').forEach((th, col) => th.addEventListener('click', () => {
  const body = th.closest('table').tBodies[0], rows = Array.from(body.rows);
  const key = r => { const t = r.cells[col].textContent.trim(), n = parseFloat(t.replace(/,/g, ''));
                     return isNaN(n) ? t : n; };
  const dir = th.dataset.dir === 'asc' ? -1 : 1; th.dataset.dir = dir === 1 ? 'asc' : 'desc';
  rows.sort((a, b) => { const x = key(a), y = key(b);
    return (typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0) : (typeof x === 'number' ? -1 : 1)) * dir; });
  rows.forEach(r => body.appendChild(r));
}));
"""


def render_html(summary: pd.DataFrame, figures: Iterable[Path] = (), notes: str = "") -> str:
    """One self-contained page: a verdict in words, sortable tables, then each figure embedded as a base64
    PNG (mail it, open it offline)."""
    parts = ["<section id=verdict><h2>Verdict</h2><ul>"
             + "".join(f"<li>{line}</li>" for line in verdict_lines(summary)) + "</ul></section>"]
    for job, table, errors in display_tables(summary):
        parts.append(f"<h2>{html.escape(job)}</h2>\n"
                     + table.to_html(index=False, border=0, escape=True, classes="sortable"))
        parts.append(f"<p class=note>{html.escape(_notes(summary, job).strip())}</p>")
        parts.extend(f"<p class=error>{html.escape(e)}</p>" for e in errors)
    if notes:
        parts.append(f"<pre>{html.escape(notes)}</pre>")
    for figure in figures:
        data = base64.b64encode(figure.read_bytes()).decode("ascii")
        parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="{figure.stem}">'
                     f"<figcaption>{figure.name}</figcaption></figure>")
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:85%}"
             "td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}th{cursor:pointer;"
             "background:#f4f4f4}th:hover{background:#e4e4f4}img{max-width:100%}.error{color:#a00}"
             ".note{color:#555;font-size:85%}#verdict{background:#f6f8fa;padding:.5em 1em;border-radius:6px}")
    return (f"<!doctype html>\n<html><head><meta charset=utf-8><title>optbench report</title>"
            f"<style>{style}</style></head><body>\n<h1>optbench report</h1>\n" + "\n".join(parts)
            + f"\n<script>{SORT_JS}</script>\n</body></html>\n")


def _spans_model_sizes(trials: pd.DataFrame) -> bool:
    """True for a scaling sweep: some optimizer has ok trials at two or more parameter counts."""
    ok = trials[trials["status"] == "ok"]
    return bool(len(ok)) and bool((ok.groupby("optimizer")["num_params"].nunique() >= 2).any())


def write_report(records: list[Record], out_dir: Path, fmt: str = "md", figures: bool = True
                 ) -> tuple[str, list[Path]]:
    """Write report.md, summary.csv and the figures (and report.html for fmt html) into out_dir.

    Returns (the report rendered in `fmt`, the paths written); report.md and summary.csv come first.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown report format '{fmt}'; known: {', '.join(FORMATS)}")
    trials = trials_frame(records)
    summary = summarize(trials)
    markdown = render_markdown(summary)
    if _spans_model_sizes(trials):
        from optbench import scaling

        markdown += "\n" + scaling.render_scaling_markdown(trials)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "report.md", out_dir / "summary.csv"]
    paths[0].write_text(markdown, encoding="utf-8")
    summary.to_csv(paths[1], index=False)
    if figures:
        from optbench.plots import write_plots

        paths += write_plots(trials, summary, out_dir)
        if _spans_model_sizes(trials):
            from optbench import scaling

            paths.append(scaling.plot_scaling(trials, out_dir / scaling.FIGURE_NAME))
    text = {"md": lambda: markdown, "csv": lambda: summary.to_csv(index=False), "json": lambda: render_json(summary),
            "html": lambda: render_html(summary, [p for p in paths if p.suffix == ".png"],
                                        render_profile_markdown(summary))}[fmt]()
    if fmt == "html":
        paths.append(out_dir / "report.html")
        paths[-1].write_text(text, encoding="utf-8")
    return text, paths
