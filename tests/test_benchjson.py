"""pytest-benchmark JSON as records: the benchmarks of one job merge into one Record, and `report` and
`compare` read .json files and autosave folders like results files."""

import dataclasses
import json

import pandas as pd
import pytest

from optbench.__main__ import main
from optbench.records.benchjson import read_benchmark_records
from optbench.records.record import Record

MIB = 2**20
JOB = dict(model="all-MiniLM-L6-v2", dataset="embedded-reviews", device="cpu", steps=30, batch_size=16, seq_len=32,
           workload="minilm", status="ok")


def _record(optimizer, **fields):
    return Record(trial_id=f"id-{optimizer}", optimizer=optimizer, state_precision="fp32", **JOB, **fields)


def _bench(kind, record, median_s):
    """One benchmark entry shaped as pytest-benchmark writes it, extra_info as benchmarks/ fills it."""
    info = {"kind": kind, **{k: v for k, v in record.to_dict().items() if k not in ("loss_curve", "env")}}
    return {"group": kind, "name": f"test_{kind}[{record.optimizer}]", "fullname": f"x::test_{kind}",
            "params": {"optimizer_spec": record.optimizer}, "param": record.optimizer, "extra_info": info,
            "options": {}, "stats": {"min": median_s, "max": median_s, "mean": median_s, "median": median_s,
                                     "iqr": 0.001, "rounds": 5, "iterations": 1}}


def _document(benchmarks, when="2026-01-01T00:00:00+00:00"):
    return {"machine_info": {"python_version": "3.11.7", "cpu": {"brand_raw": "Some CPU"}, "gpu": None,
                             "torch": "2.13.0", "bitsandbytes": "0.50.2", "optbench_preset": "default"},
            "commit_info": {"id": "abc123"}, "benchmarks": benchmarks, "datetime": when, "version": "5.3.1"}


def _suite(adamw_step_s=0.400, adamw8bit_state=int(5.5 * MIB)):
    adamw = _record("adamw", state_bytes=100 * MIB, peak_rss_growth_bytes=300 * MIB, peak_rss_bytes=900 * MIB)
    finetune = dataclasses.replace(adamw, eval_accuracy=0.75, eval_f1=0.7, step_time_median_s=0.5,
                                   peak_rss_growth_bytes=350 * MIB)
    adamw8bit = _record("adamw8bit", state_bytes=adamw8bit_state, peak_rss_growth_bytes=200 * MIB)
    unrelated = {"name": "test_other", "extra_info": {}, "stats": {"median": 1.0}}
    return [_bench("optimizer_step", adamw, 0.100), _bench("train_step", adamw, adamw_step_s),
            _bench("finetune", finetune, 20.0), _bench("optimizer_step", adamw8bit, 0.300),
            _bench("harness_overhead", adamw, 9.0), unrelated]


@pytest.fixture
def bench_file(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_document(_suite())))
    return path


def test_one_record_per_job_each_kind_filling_its_fields(bench_file):
    records = {r.optimizer: r for r in read_benchmark_records(bench_file)}
    assert sorted(records) == ["adamw", "adamw8bit"]  # harness_overhead and foreign benchmarks are skipped
    adamw = records["adamw"]
    assert adamw.status == "ok"
    assert adamw.optimizer_step_median_s == 0.100  # from optimizer_step's stats
    assert adamw.step_time_median_s == 0.400  # from train_step's stats, not the fine-tune's own median
    assert adamw.samples_per_s == pytest.approx(16 / 0.4)
    assert adamw.eval_accuracy == 0.75 and adamw.peak_rss_growth_bytes == 350 * MIB  # the fine-tune's
    assert adamw.env["torch"] == "2.13.0" and adamw.env["git_commit"] == "abc123" and adamw.env["cpu"] == "Some CPU"
    only_step = records["adamw8bit"]
    assert only_step.optimizer_step_median_s == 0.300 and only_step.step_time_median_s is None
    assert only_step.eval_accuracy is None


def test_failed_fine_tune_marks_the_job(tmp_path):
    benches = _suite()
    benches[2]["extra_info"].update(status="diverged", error="loss became nan")
    path = tmp_path / "b.json"
    path.write_text(json.dumps(_document(benches)))
    adamw = next(r for r in read_benchmark_records(path) if r.optimizer == "adamw")
    assert (adamw.status, adamw.error) == ("diverged", "loss became nan")


def test_report_reads_an_autosave_folder_latest_run_last(tmp_path, capsys):
    folder = tmp_path / ".benchmarks" / "Linux-CPython-3.11-64bit"
    folder.mkdir(parents=True)
    (folder / "0001_old.json").write_text(json.dumps(_document(_suite(adamw_step_s=0.9))))
    (folder / "0002_new.json").write_text(json.dumps(_document(_suite(adamw_step_s=0.4))))
    assert main(["report", str(tmp_path / ".benchmarks"), "--out-dir", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "### all-MiniLM-L6-v2 on embedded-reviews, cpu, 30 steps x batch 16 x seq 32" in out
    adamw = pd.read_csv(tmp_path / "out" / "summary.csv").set_index("optimizer").loc["adamw"]
    assert adamw["step_ms"] == pytest.approx(400.0) and adamw["eval_accuracy"] == pytest.approx(0.75)


def test_compare_two_benchmark_runs(tmp_path, bench_file, capsys):
    worse = tmp_path / "worse.json"
    worse.write_text(json.dumps(_document(_suite(adamw_step_s=0.5, adamw8bit_state=int(6 * MIB)))))
    assert main(["compare", str(bench_file), str(bench_file)]) == 0
    # Past a 10 % threshold (the CPU's calibrated default is 25 %, which this +25 % does not clear).
    assert main(["compare", str(bench_file), str(worse), "--max-slowdown", "10"]) == 1
    out = capsys.readouterr().out
    assert "- adamw [" in out and "step time +25.0 %" in out
    assert "- adamw8bit [" in out and "state +9.1 %" in out


def test_a_median_that_is_not_a_number_is_bad_input(tmp_path, capsys):
    benches = _suite()
    benches[0]["stats"]["median"] = "fast"
    path = tmp_path / "b.json"
    path.write_text(json.dumps(_document(benches)))
    assert main(["report", str(path)]) == 2
    assert "has no positive stats.median" in capsys.readouterr().err


def _broken(bench):
    bench["stats"] = [1, 2]


@pytest.mark.parametrize("breaks, message", [
    (_broken, "has no positive stats.median"),
    (lambda bench: bench["stats"].update(median=-0.1), "has no positive stats.median"),
    (lambda bench: bench["extra_info"].update(batch_size="x"), "field batch_size is 'x', not a whole number"),
    (lambda bench: bench["extra_info"].pop("optimizer"), "names no optimizer"),
])
def test_a_malformed_benchmark_is_one_line_not_a_traceback(tmp_path, capsys, breaks, message):
    """A list for stats, a string for batch_size ended `report` in a traceback; a benchmark with no optimizer was
    tabulated under an empty name; a negative median printed as a step time of -100 ms."""
    bench = _bench("optimizer_step", _record("adamw", state_bytes=100 * MIB), 0.4)
    breaks(bench)
    path = tmp_path / "b.json"
    path.write_text(json.dumps(_document([bench])))
    assert main(["report", "--out-dir", str(tmp_path / "r"), str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_kind_that_is_not_a_name_is_not_optbenchs(tmp_path):
    benches = _suite()
    benches[0]["extra_info"]["kind"] = ["train_step"]  # was: TypeError, unhashable type
    path = tmp_path / "b.json"
    path.write_text(json.dumps(_document(benches)))
    assert len(read_benchmark_records(path)) == len(read_benchmark_records(path)) >= 1


def test_raw_rounds_become_samples_when_saved(tmp_path):
    benches = _suite()
    benches[0]["stats"]["data"] = [0.09, 0.1, 0.11, 0.1, 0.12]  # --benchmark-save-data
    path = tmp_path / "b.json"
    doc = _document(benches)
    doc["machine_info"]["cpu"]["count"] = 2
    path.write_text(json.dumps(doc))
    records = {r.optimizer: r for r in read_benchmark_records(path)}
    assert records["adamw"].optimizer_step_samples_s == [0.09, 0.1, 0.11, 0.1, 0.12]
    assert records["adamw"].step_time_samples_s == []  # train_step's rounds were not saved
    assert records["adamw"].env["cpu_count"] == 2
