"""Turn records into the trade-off table: one row per optimizer per job, AdamW as the reference.

Numbers are means over seeds (± std where there are several); failed trials get their own row with
their status and message, so nothing disappears from the table. A re-run trial (same trial_id) counts
once, with its latest record.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from optbench.results import Record

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
]
RELATIVE = ["mem saved % vs adamw", "speed x vs adamw", "acc Δ pts vs adamw"]


def job_label(row: pd.Series) -> str:
    return (f"{row['model']} on {row['dataset']}, {row['device']}, {row['steps']} steps x batch "
            f"{row['batch_size']} x seq {row['seq_len']}")


def trials_frame(records: Iterable[Record]) -> pd.DataFrame:
    """One row per trial (latest record per trial_id), with derived unit columns."""
    frame = pd.DataFrame([r.to_dict() for r in records])
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
    return frame


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """Numeric summary: one row per (job, optimizer, status) with mean and std columns."""
    columns = [source for _, source, _ in METRICS]
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


def render_markdown(summary: pd.DataFrame) -> str:
    """One markdown table per job, headed by the job's settings."""
    parts = []
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
        errors = [f"- {r.optimizer} ({r.status}): {r.error}" for r in group.itertuples()
                  if r.status != "ok" and r.error]
        parts.append(f"### {job}\n\n" + table.to_markdown(index=False) + ("\n\n" + "\n".join(errors)
                                                                         if errors else ""))
    return "\n\n".join(parts) + "\n"


def write_report(records: list[Record], out_dir: Path) -> tuple[str, list[Path]]:
    """Render the table; write report.md and summary.csv into out_dir. Returns (markdown, paths)."""
    summary = summarize(trials_frame(records))
    markdown = render_markdown(summary)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "report.md", out_dir / "summary.csv"]
    paths[0].write_text(markdown, encoding="utf-8")
    summary.to_csv(paths[1], index=False)
    return markdown, paths
