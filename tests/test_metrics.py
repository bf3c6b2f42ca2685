"""The metric table: what each entry reads from a record, and that one entry is all a new gated column takes."""

import dataclasses

import pytest

from optbench.records.record import MIB, Record
from optbench.report import compare, metrics
from optbench.report.render import render_markdown, render_terminal, summarize, trials_frame

JOB = dict(model="m", dataset="d", device="cpu", steps=10, batch_size=4, seq_len=8, workload="w")


def _record(trial_id="a0", optimizer="adamw", seed=0, **fields):
    return Record(trial_id=trial_id, optimizer=optimizer, seed=seed, status="ok", state_precision="fp32",
                  state_bytes=80 * MIB, peak_rss_bytes=1000 * MIB, peak_rss_growth_bytes=300 * MIB,
                  rss_growth_after_step_bytes=200 * MIB, weights_bytes=100 * MIB, grads_bytes=100 * MIB,
                  step_time_median_s=0.25, eval_accuracy=0.9, **{**JOB, **fields})


def test_columns_and_titles_are_unique_and_every_time_gate_has_samples():
    columns = [m.column for m in metrics.METRICS]
    titles = [m.title for m in metrics.METRICS if m.show]
    assert len(set(columns)) == len(columns) and len(set(titles)) == len(titles)
    assert all(m.samples for m in metrics.gated() if m.gate == metrics.TIME)
    assert {m.column for m in metrics.gated()} == {"state_mib", "train_mem_mib", "step_ms", "opt_step_ms",
                                                   "eval_target"}
    assert metrics.QUALITY_METRIC.higher_is_better("min") is False and metrics.QUALITY_METRIC.higher_is_better()


def test_values_from_a_cpu_and_a_cuda_record():
    cpu = metrics.record_values(_record(held_other_bytes=20 * MIB, checkpoint_bytes=160 * MIB,
                                        optimizer_impl="per-tensor loop", resume_status="exact"))
    assert (cpu["peak_mib"], cpu["train_mem_mib"], cpu["held_mib"], cpu["held_other_mib"]) == (1000, 300, 200, 20)
    assert (cpu["ckpt_mib"], cpu["impl"], cpu["resume"], cpu["step_ms"]) == (160, "per-tensor loop", "exact", 250)
    cuda = metrics.record_values(_record(peak_cuda_allocated_bytes=600 * MIB, peak_memory_bytes=600 * MIB,
                                         predicted_peak_bytes=660 * MIB, device_bandwidth_bytes_per_s=2.5e12))
    assert (cuda["peak_mib"], cuda["train_mem_mib"], cuda["held_mib"]) == (600, 600, None)  # held: CPU only
    assert cuda["peak_prediction_error_pct"] == pytest.approx(10.0) and cuda["probe_gb_s"] == 2500
    lm = metrics.record_values(_record(target_metric="perplexity", target_mode="min",
                                       eval_metrics={"perplexity": 3.5, "loss": 1.25}))
    assert lm["eval_target"] == 3.5


def test_the_new_record_fields_show_in_the_report():
    records = [_record(f"a{s}", seed=s, held_other_bytes=20 * MIB, checkpoint_bytes=160 * MIB, checkpoint_save_s=0.5,
                       checkpoint_load_s=0.25, resume_status="exact" if s else "close", optimizer_impl="fused",
                       peak_memory_bytes=400 * MIB, predicted_peak_bytes=380 * MIB) for s in (0, 1)]
    markdown = render_markdown(summarize(trials_frame(records)))
    header, row = (line for line in markdown.splitlines() if line.startswith("| ") and "---" not in line)
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")], strict=True))
    assert cells["held other MiB"] == "20 ± 0" and cells["ckpt MiB"] == "160.0 ± 0.0"
    assert cells["resume"] == "close/exact" and cells["impl"] == "fused"
    assert cells["pred. err %"] == "-5.0 ± 0.0" and cells["pred. peak MiB"] == "380 ± 0"


def test_one_table_entry_is_a_report_column_and_a_compare_gate(monkeypatch):
    entry = metrics.Metric("ckpt_gate_mib", "ckpt gated MiB", "MiB", 1, metrics.LOWER,
                           lambda r: None if r.checkpoint_bytes is None else r.checkpoint_bytes / MIB, metrics.MEMORY,
                           label="checkpoint", compact=True)
    monkeypatch.setattr(metrics, "METRICS", (*metrics.METRICS, entry))
    base = [_record(checkpoint_bytes=100 * MIB)]
    new = [dataclasses.replace(base[0], checkpoint_bytes=150 * MIB)]
    assert "ckpt gated MiB" in render_markdown(summarize(trials_frame(new)))
    assert "ckpt gated MiB" in render_terminal(new)
    comparison = compare.compare(base, new, compare.Thresholds())
    assert [line.split(": ", 1)[1] for line in comparison.regressions] == ["checkpoint +50.0 % (limit 5 %)"]
