"""The report on a hand-written results file: means, std over seeds, relative columns, failed rows."""

import pandas as pd
import pytest

from optbench.report import summarize, trials_frame, write_report
from optbench.results import Record

MIB = 2**20
JOB = dict(model="m", dataset="d", device="cpu", steps=10, batch_size=4, seq_len=8, workload="w")


def _ok(trial_id, optimizer, seed, state_mib, growth_mib, step_s, acc, precision="fp32"):
    return Record(trial_id=trial_id, optimizer=optimizer, seed=seed, status="ok", state_precision=precision,
                  state_bytes=int(state_mib * MIB), state_bytes_per_param=8.0,
                  peak_rss_bytes=int((1000 + growth_mib) * MIB), peak_rss_growth_bytes=int(growth_mib * MIB),
                  step_time_median_s=step_s, optimizer_step_median_s=step_s / 4, samples_per_s=4 / step_s,
                  eval_accuracy=acc, eval_f1=acc, **JOB)


@pytest.fixture
def records():
    return [
        _ok("a0", "adamw", 0, 100, 400, 0.200, 0.90),
        _ok("a1", "adamw", 1, 100, 400, 0.200, 0.80),
        _ok("b0", "adamw8bit", 0, 25, 300, 0.400, 0.86, precision="int8-blockwise"),
        Record(trial_id="c0", optimizer="adafactor", seed=0, status="diverged", error="loss became nan",
               state_precision="factored", **JOB),
    ]


def test_summary_means_stds_and_relative_columns(records):
    summary = summarize(trials_frame(records)).set_index("optimizer")
    assert summary.loc["adamw", "eval_accuracy"] == pytest.approx(0.85)
    assert summary.loc["adamw", "eval_accuracy_std"] == pytest.approx(0.0707, abs=1e-4)
    assert summary.loc["adamw8bit", "mem saved % vs adamw"] == pytest.approx(25.0)  # 300 vs 400 MiB growth
    assert summary.loc["adamw8bit", "speed x vs adamw"] == pytest.approx(0.5)
    assert summary.loc["adamw8bit", "acc Δ pts vs adamw"] == pytest.approx(1.0)
    assert summary.loc["adafactor", "status"] == "diverged"


def test_markdown_and_csv_keep_failed_trials(records, tmp_path):
    markdown, paths = write_report(records, tmp_path)
    assert "| adafactor" in markdown and "diverged 1/1" in markdown and "loss became nan" in markdown
    assert "0.850 ± 0.071" in markdown
    assert "state MiB" in markdown and "step ms" in markdown and "mem saved % vs adamw" in markdown
    csv = pd.read_csv(paths[1])
    assert set(csv["optimizer"]) == {"adamw", "adamw8bit", "adafactor"}


def test_rerun_trial_counts_once_with_its_latest_record(records):
    retry = _ok("c0", "adafactor", 0, 0.5, 200, 0.3, 0.7, precision="factored")
    summary = summarize(trials_frame(records + [retry])).set_index("optimizer")
    assert summary.loc["adafactor", "status"] == "ok"
