"""Turn records into the trade-off table: one row per optimizer per job, AdamW as the reference.

Numbers are means over seeds (± std where there are several); failed trials get their own row with
their status and message, so nothing disappears from the table. A re-run trial (same trial_id) counts
once, with its latest record. The same summary renders as markdown, csv, json or a self-contained
html page with the figures (plots.py, imported only when figures are written).
"""

from __future__ import annotations

import base64
import dataclasses
import html
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from optbench.results import Record, split_peak_memory

MIB = 2**20
REFERENCE = "adamw"

# (column in the table, how to get it from the per-trial frame, decimals)
METRICS: list[tuple[str, str, int]] = [
    ("state MiB", "state_mib", 1),
    ("state B/param", "state_bytes_per_param", 3),
    ("peak MiB", "peak_mib", 0),
    ("train mem MiB", "train_mem_mib", 0),
    ("held MiB", "held_mib", 0),
    ("step ms", "step_ms", 1),
    ("opt step ms", "opt_step_ms", 1),
    ("samples/s", "samples_per_s", 1),
    ("eval acc", "eval_accuracy", 3),
    ("eval F1", "eval_f1", 3),
    ("update cos", "update_cosine_median", 4),  # only with `run --fidelity`; blank otherwise
]
# Averaged over seeds for the figures, not shown in the table.
FIGURE_COLUMNS = ["weights_mib", "grads_mib", "peak_memory_mib", "other_peak_mib", "update_rel_error_median"]
FORMATS = ("md", "csv", "json", "html")
RELATIVE = ["mem saved % vs adamw", "speed x vs adamw", "acc Δ pts vs adamw"]


def job_label(row: pd.Series) -> str:
    # Fidelity trials carry a shadow AdamW (its memory is in their peaks): they are a job of their own.
    fidelity = " + fidelity probe" if row.get("fidelity") is True else ""
    return (f"{row['model']} on {row['dataset']}, {row['device']}, {row['steps']} steps x batch "
            f"{row['batch_size']} x seq {row['seq_len']}{fidelity}")


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
    _add_memory_parts(frame)
    for name in ("update_cosine_median", "update_rel_error_median"):
        frame[name] = _numeric(frame, name)
    return frame


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
    """Numeric summary: one row per (job, optimizer, status) with mean and std columns."""
    columns = [source for _, source, _ in METRICS] + FIGURE_COLUMNS
    rows = []
    for (job, optimizer, status), group in frame.groupby(["job", "optimizer", "status"], sort=False):
        row = {"job": job, "optimizer": optimizer, "precision": group["state_precision"].iloc[0],
               "status": status, "trials": len(group),
               "of_trials": int(((frame["job"] == job) & (frame["optimizer"] == optimizer)).sum()),
               "error": "; ".join(sorted({str(e) for e in group["error"].dropna()}))[:200] or None}
        if status == "ok":
            for source in columns:
                values = pd.to_numeric(group[source], errors="coerce").dropna()
                row[source] = values.mean() if len(values) else None
                row[source + "_std"] = values.std() if len(values) > 1 else None
        rows.append(row)
    summary = pd.DataFrame(rows)
    for job in summary["job"].unique():
        ref = summary[(summary["job"] == job) & (summary["optimizer"] == REFERENCE)
                      & (summary["status"] == "ok")]
        mask = (summary["job"] == job) & (summary["status"] == "ok")
        if ref.empty:
            continue
        ref = ref.iloc[0]
        summary.loc[mask, RELATIVE[0]] = 100 * (1 - summary.loc[mask, "train_mem_mib"] / ref["train_mem_mib"])
        summary.loc[mask, RELATIVE[1]] = ref["step_ms"] / summary.loc[mask, "step_ms"]
        summary.loc[mask, RELATIVE[2]] = 100 * (summary.loc[mask, "eval_accuracy"] - ref["eval_accuracy"])
    return summary


def _cell(row: pd.Series, source: str, decimals: int) -> str:
    value = row.get(source)
    if value is None or pd.isna(value):
        return ""
    text = f"{value:,.{decimals}f}"
    std = row.get(source + "_std")
    return text if std is None or pd.isna(std) else f"{text} ± {std:,.{decimals}f}"


def display_tables(summary: pd.DataFrame) -> list[tuple[str, pd.DataFrame, list[str]]]:
    """Per job: (job label, the formatted table, one line per failed row's error)."""
    tables = []
    for job, group in summary.groupby("job", sort=False):
        table = pd.DataFrame({
            "optimizer": group["optimizer"],
            "precision": group["precision"],
            "status": [f"{r.status} {r.trials}/{r.of_trials}" for r in group.itertuples()],
            **{title: [_cell(r, source, d) for _, r in group.iterrows()] for title, source, d in METRICS},
            RELATIVE[0]: [_cell(r, RELATIVE[0], 1) for _, r in group.iterrows()],
            RELATIVE[1]: [_cell(r, RELATIVE[1], 2) for _, r in group.iterrows()],
            RELATIVE[2]: [_cell(r, RELATIVE[2], 1) for _, r in group.iterrows()],
        })
        errors = [f"{r.optimizer} ({r.status}): {r.error}" for r in group.itertuples()
                  if r.status != "ok" and r.error]
        tables.append((str(job), table, errors))
    return tables


def render_markdown(summary: pd.DataFrame) -> str:
    """One markdown table per job, headed by the job's settings."""
    parts = []
    for job, table, errors in display_tables(summary):
        parts.append(f"### {job}\n\n" + table.to_markdown(index=False)
                     + ("\n\n" + "\n".join(f"- {e}" for e in errors) if errors else ""))
    return "\n\n".join(parts) + "\n"


def render_json(summary: pd.DataFrame) -> str:
    """The numeric summary as a JSON array of rows (NaN as null), for scripts and dashboards."""
    return summary.to_json(orient="records", indent=1, force_ascii=False) + "\n"


def render_html(summary: pd.DataFrame, figures: Iterable[Path] = ()) -> str:
    """One self-contained page: the tables, then each figure embedded as a base64 PNG (mail it, open it)."""
    parts = []
    for job, table, errors in display_tables(summary):
        parts.append(f"<h2>{html.escape(job)}</h2>\n" + table.to_html(index=False, border=0, escape=True))
        parts.extend(f"<p class=error>{html.escape(e)}</p>" for e in errors)
    for figure in figures:
        data = base64.b64encode(figure.read_bytes()).decode("ascii")
        parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="{figure.stem}">'
                     f"<figcaption>{figure.name}</figcaption></figure>")
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:90%}"
             "td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}img{max-width:100%}"
             ".error{color:#a00}")
    return (f"<!doctype html>\n<html><head><meta charset=utf-8><title>optbench report</title>"
            f"<style>{style}</style></head><body>\n<h1>optbench report</h1>\n" + "\n".join(parts)
            + "\n</body></html>\n")


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
            "html": lambda: render_html(summary, [p for p in paths if p.suffix == ".png"])}[fmt]()
    if fmt == "html":
        paths.append(out_dir / "report.html")
        paths[-1].write_text(text, encoding="utf-8")
    return text, paths
