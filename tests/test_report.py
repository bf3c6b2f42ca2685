"""The report on a hand-written results file: means, std over seeds, relative columns, failed rows, formats."""

import io
import json
import subprocess
import sys

import pandas as pd
import pytest

from optbench.records.record import Record
from optbench.report.render import render_terminal, summarize, trials_frame, write_report

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
    # paired on the one seed both ran (seed 0: 0.86 vs 0.90), so no interval and no verdict either way
    assert summary.loc["adamw8bit", "delta_vs_adamw"] == pytest.approx(-4.0)
    assert summary.loc["adamw8bit", "verdict_vs_adamw"] == "inconclusive (one seed: no interval)"
    assert summary.loc["adafactor", "status"] == "diverged"


def test_markdown_and_csv_keep_failed_trials(records, tmp_path):
    markdown, paths = write_report(records, tmp_path)
    assert "| adafactor" in markdown and "diverged 1/1" in markdown and "loss became nan" in markdown
    assert "0.8500 ± 0.6353" in markdown  # t(0.975, 1) = 12.706 x 0.0707 / sqrt(2)
    assert "state MiB" in markdown and "step ms" in markdown and "mem saved % vs adamw" in markdown
    csv = pd.read_csv(paths[1])
    assert set(csv["optimizer"]) == {"adamw", "adamw8bit", "adafactor"}


def test_rerun_trial_counts_once_with_its_latest_record(records):
    retry = _ok("c0", "adafactor", 0, 0.5, 200, 0.3, 0.7, precision="factored")
    summary = summarize(trials_frame(records + [retry])).set_index("optimizer")
    assert summary.loc["adafactor", "status"] == "ok"


@pytest.mark.parametrize("fields,peak_mib,other_mib", [
    (dict(peak_memory_bytes=70 * MIB), 70, 30),  # the record's own figure, where nothing measured derives it
    (dict(peak_memory_bytes=70 * MIB, peak_cuda_allocated_bytes=90 * MIB), 90, 50),  # derived again from the peak
    (dict(peak_rss_growth_bytes=50 * MIB), 60, 20),  # older CPU record: weights + peak RSS growth
    (dict(peak_cuda_allocated_bytes=80 * MIB, peak_rss_growth_bytes=5 * MIB), 80, 40),  # older CUDA record
])
def test_peak_memory_and_its_rest(fields, peak_mib, other_mib):
    record = Record(trial_id="p", optimizer="adamw", status="ok", weights_bytes=10 * MIB, grads_bytes=10 * MIB,
                    state_bytes=20 * MIB, **fields, **JOB)
    frame = trials_frame([record])
    assert frame.loc[0, "peak_memory_mib"] == peak_mib and frame.loc[0, "other_peak_mib"] == other_mib


def test_records_without_model_side_sizes_get_no_peak(records):
    assert trials_frame(records)["peak_memory_mib"].isna().all()  # no weights_bytes: NaN, not a crash


def test_update_cos_column_absent_without_fidelity_filled_with_it(records, tmp_path):
    markdown, _ = write_report(records, tmp_path, figures=False)
    assert "update cos" not in markdown  # a column no row fills is left out
    fid = _ok("f0", "adamw8bit", 0, 25, 300, 0.4, 0.86)
    fid.update_cosine_median, fid.update_rel_error_median = 0.99871, 0.05
    markdown, _ = write_report(records + [fid], tmp_path, figures=False)
    assert "0.9987" in markdown


@pytest.mark.parametrize("fmt", ["md", "csv", "json", "html"])
def test_formats_print_their_own_text_and_always_write_md_and_csv(records, tmp_path, fmt):
    text, paths = write_report(records, tmp_path, fmt=fmt)
    names = [p.name for p in paths]
    assert names[:2] == ["report.md", "summary.csv"] and "tradeoff.png" in names
    if fmt == "json":
        rows = json.loads(text)
        assert {r["optimizer"] for r in rows} == {"adamw", "adamw8bit", "adafactor"}
        assert next(r for r in rows if r["optimizer"] == "adafactor")["eval_accuracy"] is None
    elif fmt == "csv":
        assert set(pd.read_csv(io.StringIO(text))["optimizer"]) == {"adamw", "adamw8bit", "adafactor"}
    elif fmt == "html":
        assert names[-1] == "report.html" and (tmp_path / "report.html").read_text() == text
        assert text.count('<img src="data:image/png;base64,') == 3 and "<table" in text and "loss became nan" in text
    else:
        assert text == (tmp_path / "report.md").read_text()
    assert (fmt == "html") == ("report.html" in names)


def test_unknown_format_is_refused(records, tmp_path):
    with pytest.raises(ValueError, match="unknown report format 'pdf'"):
        write_report(records, tmp_path, fmt="pdf")


def test_a_sweep_over_model_sizes_gets_the_scaling_fit(tmp_path):
    sweep = []
    for width, params in [(32, 1_000_000), (64, 2_000_000), (128, 4_000_000)]:
        job = {**JOB, "model": f"tiny-bert-h{width}", "workload": "tiny", "workload_options": {"hidden_size": width}}
        sweep.append(Record(trial_id=f"s{width}", optimizer="adamw", status="ok", state_precision="fp32",
                            num_params=params, state_bytes=8 * params + 400, step_time_median_s=0.01,
                            **job))
    markdown, paths = write_report(sweep, tmp_path)
    assert "State bytes vs parameters: fits" in markdown and "8.0000" in markdown
    assert tmp_path / "scaling.png" in paths and (tmp_path / "scaling.png").read_bytes().startswith(b"\x89PNG")


def test_unrelated_jobs_at_two_parameter_counts_are_no_scaling_sweep(tmp_path):
    """Two jobs on datasets of 2 and 3 classes (heads of two sizes) read as a scaling sweep: its fit table printed
    "nan" slopes and exponents, and scaling.png was drawn."""
    jobs = [Record(trial_id=f"d{labels}", optimizer="adamw", status="ok", state_precision="fp32",
                   num_params=1_000_000 + labels, state_bytes=8 * (1_000_000 + labels), step_time_median_s=0.01,
                   **{**JOB, "dataset": f"{labels}-classes.csv"}) for labels in (2, 3)]
    markdown, paths = write_report(jobs, tmp_path)
    assert "State bytes vs parameters" not in markdown and "nan" not in markdown
    assert tmp_path / "scaling.png" not in paths


def test_fidelity_trials_are_a_job_of_their_own(records):
    probe = _ok("f0", "adamw", 0, 100, 900, 0.3, 0.9)
    probe.fidelity = True
    frame = trials_frame(records + [probe])
    assert frame["job"].nunique() == 2


# --- study records: tuned lr, paired verdicts, time to target, profile ------------------------------------

def _study():
    from _study_fixture import study_records

    return study_records()


def test_study_report_tuned_lr_verdicts_and_time_to_target():
    summary = summarize(trials_frame(_study()))
    assert len(summary) == 6  # tune trials stay out of the table: 2 jobs x 3 optimizers
    job = summary[summary["job"].str.startswith("minilm")].set_index("optimizer")
    assert job.loc["adamw", "tuned_lr"] == pytest.approx(1e-4)
    assert job.loc["adafactor", "tuned_lr"] == pytest.approx(1e-3)
    assert job.loc["adamw8bit", "tune_points"] == "3/4"  # its diverged point is counted, not chosen
    assert job.loc["adamw", "tune_steps"] == 8 and job.loc["adamw", "of_trials"] == 3  # the tuned seed 0 is a final
    assert job.loc["adamw", "tune_band"] == pytest.approx((2 * 0.9 * 0.1 / 400) ** 0.5)
    assert job.loc["adafactor", "verdict_vs_adamw"] == "worse by at least 1 pt"  # -3.97 ± 0.38 pts
    assert job.loc["adamw8bit", "verdict_vs_adamw"] == "inconclusive (about 4 seeds would settle it)"  # -0.03 ± 1.00
    # target = 0.95 x adamw's final mean 0.90167 (no target fixed before: set after the fact); adamw's curves
    # (value - 0.3 / k at step k, k x 0.4 s) cross it between steps 4 and 8: interpolated, the bracket 1.6 s
    target = 0.95 * (0.9 + 0.9 + 0.01 + 0.9 - 0.005) / 3
    assert job.loc["adamw", "job_target"] == pytest.approx(target) and not job.loc["adamw", "job_target_fixed"]
    shares = sorted((target - (v - 0.3 / 4)) / (0.3 / 4 - 0.3 / 8) for v in (0.9, 0.91, 0.895))
    assert job.loc["adamw", "steps_to_target"] == pytest.approx(4 + 4 * shares[1])
    assert job.loc["adamw", "time_to_target_s"] == pytest.approx(1.6 + 1.6 * shares[1])
    assert job.loc["adamw", "time_to_target_s_resolution"] == pytest.approx(1.6)
    # never reached on any seed: infinite, 0 of 3; adamw8bit's seed 2 missed, its median is still finite
    assert job.loc["adafactor", "time_to_target_s"] == float("inf") and job.loc["adafactor", "time_to_target_s_n"] == 3
    assert job.loc["adamw8bit", "time_to_target_s_reached"] == 2


def test_study_markdown_says_budget_scratch_and_profile(tmp_path):
    markdown, _ = write_report(_study(), tmp_path, figures=False)
    assert "trained from scratch" in markdown and markdown.count("trained from scratch") == 1
    assert "over 1 tune seed(s) of 8 steps; lrs within the near-tie band of the best (binomial error of 400 " \
           "validation rows)" in markdown and "fewer than" not in markdown and "±2.12 pts" in markdown
    assert "-3.97 ± 0.38 pts (n=3): worse by at least 1 pt" in markdown and "| tuned lr |" in markdown.replace("  ", "")
    assert "missed (reached 0/3)" in markdown and "against a margin of ±1 pt" in markdown
    assert "performance profile" in markdown and "| adamw       |                 1 " in markdown


def test_a_target_carried_by_the_finals_is_said_to_be_fixed_before_the_runs(tmp_path):
    """A study's target is set between its stages and carried by every final (`target_value`): the note says it was
    fixed before the runs, and the after-the-fact wording (for a plain run without --target) is not used."""
    records = _study()
    for record in records:
        if record.stage == "final":
            record.target_value = 0.85
    markdown, _ = write_report(records, tmp_path, figures=False)
    assert "accuracy >= 0.85 on the eval curve (fixed before the runs)" in markdown
    assert "set after the fact" not in markdown
    markdown, _ = write_report(_study(), tmp_path / "after", figures=False)
    assert "(set after the fact: 0.95 x the best final mean" in markdown


def test_min_metric_target_and_one_seed_interval():
    records = [Record(trial_id=f"p{i}", optimizer=name, seed=0, status="ok", target_metric="perplexity",
                      target_mode="min", eval_metrics={"perplexity": ppl},
                      eval_curve=[[5, 1.0, ppl * 2], [10, 2.0, ppl]], **JOB)
               for i, (name, ppl) in enumerate([("adamw", 20.0), ("adafactor", 30.0)])]
    frame = trials_frame(records)
    summary = summarize(frame).set_index("optimizer")
    assert summary.loc["adamw", "job_target"] == pytest.approx(20.0 / 0.95)  # lower is better: best / 0.95
    assert summary.loc["adamw", "steps_to_target"] == pytest.approx(5 + 5 * (40 - 20 / 0.95) / 20)  # interpolated
    assert summary.loc["adafactor", "steps_to_target"] == float("inf")  # its curve never got down to 21.05
    assert summary.loc["adafactor", "verdict_vs_adamw"] == "inconclusive (one seed: no interval)"
    assert summary.loc["adafactor", "delta_vs_adamw"] == pytest.approx(50.0)  # +50 % perplexity
    assert summary.loc["adamw", "eval_target_ci"] is None or pd.isna(summary.loc["adamw", "eval_target_ci"])
    from optbench.report.render import render_markdown

    markdown = render_markdown(summarize(frame))
    assert "eval perplexity" in markdown and "20.0000 ± n/a" in markdown


def test_jobs_that_differ_only_in_precision_or_engine_also_share_one_table(records, tmp_path):
    import dataclasses

    bf16 = [dataclasses.replace(r, trial_id=r.trial_id + "-bf16", precision="bf16",
                                state_bytes=r.state_bytes // 2 if r.state_bytes else None,
                                state_precision="bf16" if r.optimizer == "adamw" else r.state_precision)
            for r in records]
    markdown, _ = write_report(records + bf16, tmp_path, figures=False)
    side = markdown.split("### Side by side: ")[1]
    assert side.startswith("m on d, cpu, 10 steps x batch 4 x seq 8, linear lr\n")
    rows = [line.split("|")[1:6] for line in side.splitlines() if line.startswith("| adam")]
    assert [[c.strip() for c in row] for row in rows] == [
        ["adamw", "fp32", "fp32", "ok 2/2", "100.0 ± 0.0"], ["adamw", "bf16", "bf16", "ok 2/2", "50.0 ± 0.0"],
        ["adamw8bit", "fp32", "int8-blockwise", "ok 1/1", "25.0"],
        ["adamw8bit", "bf16", "int8-blockwise", "ok 1/1", "12.5"]]
    trainer = [dataclasses.replace(r, trial_id=r.trial_id + "-trainer", engine="trainer") for r in records[:2]]
    markdown, _ = write_report(records + trainer, tmp_path, figures=False)
    side = markdown.split("### Side by side: ")[1]
    assert "| optimizer   | engine   |" in side and "weights" not in side.splitlines()[2]
    assert [line.split("|")[2].strip() for line in side.splitlines() if line.startswith("| adam")] == [
        "native", "trainer", "native"]
    alone, _ = write_report(records, tmp_path, figures=False)
    assert "side by side" not in alone  # one precision: nothing to put side by side


# --- the terminal summary, the html verdict, the import cost -------------------------------------------------

def test_terminal_summary_says_it_in_words_and_fits_120_columns(records):
    long_name = [_ok(f"l{i}", "adamw8bit_torchao_with_a_very_long_registry_name", i, 25, 300, 0.4, 0.86,
                     precision="int8-blockwise-with-a-long-label") for i in (0, 1)]
    text = render_terminal(summarize(trials_frame(records + long_name)))
    lines = text.splitlines()
    assert max(map(len, lines)) <= 120
    assert lines[0] == "m on d, cpu, 10 steps x batch 4 x seq 8, linear lr"
    words = next(line for line in lines if line.startswith("adamw8bit:"))
    assert words.startswith("adamw8bit: eval accuracy 0.8600 ± n/a vs adamw 0.85; Δ -4.00 pts: inconclusive (one seed")
    assert "memory saved 25.0 % vs adamw" in text and "speed 0.50x adamw" in text
    assert "adafactor: diverged (loss became nan)" in text
    assert "| optimizer" in text and "| eval accuracy" in text  # the compact table
    assert render_terminal(records) == render_terminal(summarize(trials_frame(records)))  # records work too


def test_html_verdict_uses_the_verdict_words(tmp_path):
    text, _ = write_report(_study(), tmp_path, fmt="html", figures=False)
    verdict = text.split("<section id=verdict>")[1].split("</section>")[0]
    assert "adafactor vs adamw on accuracy: worse by at least 1 pt" in verdict
    assert "adamw8bit vs adamw on accuracy: inconclusive (about 4 seeds would settle it)" in verdict
    assert "first to the target on every seed: adamw" in verdict  # adamw8bit missed one seed, adafactor all
    assert "no significant difference" not in text


def test_importing_the_report_loads_neither_torch_nor_matplotlib():
    code = ("import sys, optbench.report.render, optbench.report.compare, optbench.memory.recommend; "
            "print(sorted(m for m in ('torch', 'matplotlib', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_a_roofline_above_one_is_a_calibration_failure_not_a_percentage(records, tmp_path):
    for record, fraction in zip(records[:3], [0.5, 1.3, 1.6], strict=True):
        record.roofline_fraction, record.device_bandwidth_calibrated_bytes_per_s = fraction, 5e10
    markdown, _ = write_report(records, tmp_path, figures=False)
    table = markdown.split("\n\n")[1]
    header = [c.strip() for c in table.splitlines()[0].split("|")]
    cells = {row.split("|")[1].strip(): [c.strip() for c in row.split("|")] for row in table.splitlines()[2:]}
    column = header.index("roofline %")
    assert cells["adamw"][column] == "50.0 (calib. fail 1/2)"
    assert cells["adamw8bit"][column] == "calib. fail"
    assert "130" not in markdown and "160" not in markdown


def test_a_paired_share_above_one_is_a_probe_failure_not_a_percentage(records, tmp_path):
    for record, fraction in zip(records[:3], [0.9, 1.2, 1.4], strict=True):
        record.paired_roofline_fraction = fraction
    markdown, _ = write_report(records, tmp_path, figures=False)
    table = markdown.split("\n\n")[1]
    header = [c.strip() for c in table.splitlines()[0].split("|")]
    cells = {row.split("|")[1].strip(): [c.strip() for c in row.split("|")] for row in table.splitlines()[2:]}
    column = header.index("paired roofline %")
    assert cells["adamw"][column] == "90.0 (probe fail 1/2)"
    assert cells["adamw8bit"][column] == "probe fail"
    assert "120.0" not in markdown and "140.0" not in markdown


def test_a_report_of_one_file_goes_to_its_own_folder_not_the_working_directory(tmp_path, monkeypatch):
    """`report sweeps/a.jsonl` writes where `run --out sweeps/a.jsonl` wrote (sweeps/a/), not into ./results/, where
    it would overwrite another sweep's report; several files (or none) still go to results/, and --out-dir wins."""
    from optbench.__main__ import main
    from optbench.records.record import append_record

    sweeps, cwd = tmp_path / "sweeps", tmp_path / "elsewhere"
    sweeps.mkdir()
    cwd.mkdir()
    for name in ("a", "b"):
        append_record(sweeps / f"{name}.jsonl", Record(trial_id=name, optimizer="adamw", status="ok", workload="tiny",
                                                       model="m", dataset="d", device="cpu", steps=4, state_bytes=1))
    monkeypatch.chdir(cwd)
    assert main(["report", str(sweeps / "a.jsonl")]) == 0
    assert (sweeps / "a" / "report.md").is_file() and not (cwd / "results").exists()
    assert main(["report", str(sweeps / "a.jsonl"), str(sweeps / "b.jsonl")]) == 0
    assert (cwd / "results" / "report.md").is_file()
    assert main(["report", str(sweeps / "b.jsonl"), "--out-dir", str(tmp_path / "mine")]) == 0
    assert (tmp_path / "mine" / "report.md").is_file() and not (sweeps / "b").exists()
