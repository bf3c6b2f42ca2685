"""`optbench nightly`: exit codes, baseline rotation and the summary, on stages replaced by hand-made results;
and, opt-in (OPTBENCH_NIGHTLY_E2E=1, run by .ci/run), three real nights at smoke size on CPU."""

import dataclasses
import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from optbench.__main__ import main
from optbench.records.record import Record, append_record
from optbench.report import compare
from optbench.workflows import nightly

MIB = 2**20
JOB = dict(model="m", dataset="d", device="cpu", steps=8, batch_size=8, seq_len=32, workload="tiny", status="ok")
SEEDS = 3  # the sweep's processes per optimizer (the nightly preset's seeds); the suite measures one


def _record(optimizer, scale=1.0, state_mib=1.0, seed=0, process=0):
    """One trial (process `process`, the sweep's seed) of a night whose draws come from `seed`."""
    samples = list(0.02 * scale * np.exp(0.03 * np.random.default_rng(10 * seed + process).standard_normal(12)))
    median_s = float(np.median(samples))
    return Record(trial_id=f"t-{optimizer}-{process}", optimizer=optimizer, state_precision="fp32", seed=process,
                  state_bytes=int(state_mib * MIB), peak_rss_growth_bytes=50 * MIB, peak_rss_bytes=500 * MIB,
                  step_time_median_s=median_s, optimizer_step_median_s=median_s / 4, step_time_samples_s=samples,
                  optimizer_step_samples_s=[s / 4 for s in samples], eval_accuracy=0.5,
                  env={"cpu": "AMD EPYC", "torch": "2.13.0", "git_commit": "c" * 40}, **JOB)


def _processes(optimizer, scale=1.0, state_mib=1.0, seed=0):
    """A night's sweep trials of one optimizer: SEEDS processes."""
    return [_record(optimizer, scale, state_mib, seed, process) for process in range(SEEDS)]


def _benchmark_json(records, path):
    """What the suite writes: one optimizer_step benchmark per record, raw rounds saved."""
    benches = [{"name": f"test_optimizer_step[{r.optimizer}]", "extra_info": {"kind": "optimizer_step", **r.to_dict()},
                "stats": {"median": r.optimizer_step_median_s, "iqr": 0.0, "data": r.optimizer_step_samples_s}}
               for r in records]
    path.write_text(json.dumps({"machine_info": {"cpu": {"brand_raw": "AMD EPYC"}}, "commit_info": {"id": "c" * 40},
                                "benchmarks": benches, "datetime": "2026-01-01T00:00:00"}))


@pytest.fixture
def fake_stages(monkeypatch):
    """Replace the subprocess stages by writing these records as the night's sweep and benchmark results."""
    night_records = {}

    def run_stages(night):
        out = night.config.out
        for record in night_records["records"]:
            append_record(out / nightly.SWEEP_FILE, record)
        first = {r.optimizer: r for r in reversed(night_records["records"])}  # the suite: one process each
        _benchmark_json(list(first.values()), out / nightly.BENCHMARK_FILE)
        night.stage_s.update(benchmarks=1.0, sweep=1.0)

    monkeypatch.setattr(nightly, "_run_stages", run_stages)
    monkeypatch.setattr(nightly, "_write_reports", lambda night: None)
    return lambda records: night_records.update(records=records)


def _night(tmp_path, name, *extra):
    return main(["nightly", "--device", "cpu", "--preset", "smoke", "--baseline", str(tmp_path / "baseline"),
                 "--out", str(tmp_path / name), *extra])


def test_first_night_writes_the_baseline_then_a_same_night_is_clean(tmp_path, fake_stages, monkeypatch, capsys):
    step_summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    fake_stages([*_processes("adamw"), *_processes("adafactor")])
    assert _night(tmp_path, "n1") == 0
    assert sorted(p.name for p in (tmp_path / "baseline").iterdir()) == sorted(nightly.BASELINE_FILES)
    assert "first night" in (tmp_path / "n1" / "summary.md").read_text()
    fake_stages([*_processes("adamw", seed=1), *_processes("adafactor", seed=1)])
    assert _night(tmp_path, "n2") == 0
    summary = (tmp_path / "n2" / "summary.md").read_text()
    assert "## optbench nightly: clean" in summary and "within noise" in summary
    assert step_summary.read_text().count("## optbench nightly:") == 2  # appended, night after night


def test_a_regression_fails_and_keeps_the_baseline(tmp_path, fake_stages, capsys):
    fake_stages([*_processes("adamw"), *_processes("adafactor")])
    assert _night(tmp_path, "n1") == 0
    before = (tmp_path / "baseline" / nightly.SWEEP_FILE).read_bytes()
    fake_stages([*_processes("adamw", seed=1), *_processes("adafactor", scale=2.0, seed=1)])
    assert _night(tmp_path, "n2") == 1
    summary = (tmp_path / "n2" / "summary.md").read_text()
    assert "## optbench nightly: REGRESSION" in summary
    assert re.search(r"- sweep: adafactor \[.*optimizer step \+\d+\.\d %, 95 % CI \+\d", summary)
    assert "- benchmark suite: adafactor [" in summary
    assert "baseline" in summary and "kept" in summary
    assert (tmp_path / "baseline" / nightly.SWEEP_FILE).read_bytes() == before
    assert capsys.readouterr().err.strip().endswith("regression(s); baseline kept")


def test_state_growth_beyond_the_threshold_fails(tmp_path, fake_stages):
    fake_stages([*_processes("adamw")])
    assert _night(tmp_path, "n1") == 0
    fake_stages([*_processes("adamw", state_mib=1.2, seed=1)])
    assert _night(tmp_path, "n2") == 1
    assert "state +20.0 % (limit 5 %)" in (tmp_path / "n2" / "summary.md").read_text()
    fake_stages([*_processes("adamw", state_mib=1.2, seed=2)])
    assert _night(tmp_path, "n3", "--accept") == 0  # an intended change: reported, then the new baseline
    assert "accepted with --accept" in (tmp_path / "n3" / "summary.md").read_text()
    assert _night(tmp_path, "n4") == 0


def test_an_out_folder_holding_a_night_is_refused(tmp_path, fake_stages, capsys):
    fake_stages([*_processes("adamw")])
    assert _night(tmp_path, "n1") == 0
    assert _night(tmp_path, "n1") == 2
    assert "already holds a night" in capsys.readouterr().err


def test_a_baseline_of_another_job_is_a_setup_error(tmp_path, fake_stages, capsys):
    fake_stages([*_processes("adamw")])
    assert _night(tmp_path, "n1") == 0
    fake_stages([dataclasses.replace(r, steps=99) for r in _processes("adamw")])
    assert _night(tmp_path, "n2") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is another job" in err[0]


@pytest.mark.parametrize("name,text", [
    (nightly.ENVIRONMENT_FILE, "{broken"),
    (nightly.ENVIRONMENT_FILE, "[1, 2]"),
    (nightly.SWEEP_FILE, "not a record"),
    (nightly.BENCHMARK_FILE, "{}"),
])
def test_a_baseline_that_cannot_be_read_is_one_line_before_the_night(tmp_path, monkeypatch, capsys, name, text):
    """A broken environment.json ended in a JSONDecodeError traceback before any stage; a broken baseline sweep or
    suite file in a ResultsFileError traceback after the whole night had run. Both are read before the night now."""
    monkeypatch.setattr(nightly, "_run_stages", lambda night: pytest.fail("a stage ran"))
    (tmp_path / "baseline").mkdir()
    (tmp_path / "baseline" / name).write_text(text + "\n")
    assert _night(tmp_path, "n") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--baseline: {tmp_path / 'baseline' / name} cannot be read" in err[0], err
    assert not (tmp_path / "n").exists()


def test_a_night_outside_the_repository_is_refused_before_it_makes_its_folder(tmp_path, monkeypatch, capsys):
    """It wrote --out/environment.json first, then refused: no benchmarks/ here."""
    monkeypatch.chdir(tmp_path)
    assert _night(tmp_path, "n") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no benchmarks/ here" in err[0], err
    assert not (tmp_path / "n").exists()


@pytest.mark.parametrize("args,message", [
    (["--optimizers", "nope"], "unknown optimizer"),
    (["--preset", "default"], "invalid choice"),
    (["--max-slowdown", "fast"], "expected a number"),
])
def test_bad_arguments_are_one_line(tmp_path, capsys, args, message):
    assert _night(tmp_path, "n", *args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0].lower(), err


@pytest.mark.parametrize("args,message", [
    (["--workload", "bogus"], "unknown workload"),
    (["--optimizer-kwargs", "adamw={bad"], "not valid json"),
    (["--slurm-partition", "foo"], "applies to --executor slurm"),
    (["--model", "/nonexistent/optbench-model"], "model path not found"),
    (["--device", "cuda:abc"], "unknown device"),
    (["--device", "mps"], "not one optbench measures on"),
])
def test_the_sweeps_flags_are_refused_before_the_night_starts(tmp_path, capsys, monkeypatch, args, message):
    """The sweep is a child `optbench run` started after the benchmark suite (up to an hour): a flag `run` refuses
    in a second was refused only then. Now it is one line and exit 2 before any stage runs or --out is made."""
    monkeypatch.setattr(nightly, "_run_stages", lambda night: pytest.fail("a stage ran"))
    assert _night(tmp_path, "n", *args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0].lower(), err
    assert not (tmp_path / "n").exists()


@pytest.mark.parametrize("out", ["baseline", "baseline/n", "."])
def test_a_night_into_its_own_baseline_is_refused(tmp_path, capsys, monkeypatch, out):
    monkeypatch.setattr(nightly, "_run_stages", lambda night: pytest.fail("a stage ran"))
    assert _night(tmp_path, out) == 2
    assert "must be separate folders" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--device", "cuda:-1"], "unknown device"),
    (["--device", "cuda"], "no cuda device"),
    (["--device", "cpu", "--out", "o"], "drop --out"),
    # no --device: the night's default, cuda, was reported as if the user had asked for it
    ([], "a night runs on cuda unless --device says otherwise, and this torch build sees no cuda device: give "
         "--device cpu"),
])
def test_the_baseline_key_is_printed_only_for_a_device_the_night_can_run(capsys, monkeypatch, args, message):
    """`--print-baseline-key --device cuda` on a machine without a GPU printed the CPU's key (a GPU night's
    baseline filed under it), `cuda:abc` and `cuda:-1` ended in a traceback, and --out was silently ignored."""
    from optbench.job import devices

    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    assert main(["nightly", "--print-baseline-key", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0].lower(), err


def test_stage_commands():
    config = nightly.NightConfig(device="cpu", preset="smoke", baseline=Path("b"), out=Path("o"),
                                 thresholds=compare.thresholds_for("cpu"), optimizers=("adamw",),
                                 job_argv=("--workload", "tiny"))
    bench = nightly.benchmark_command(config, Path("o/benchmarks.json"))
    assert "--benchmark-save-data" in bench and "--optbench-preset=smoke" in bench
    assert "benchmarks/test_finetune.py::test_finetune[adamw]" in bench and "--optbench-harness" not in bench
    every = nightly.benchmark_command(dataclasses.replace(config, preset="nightly", optimizers=()), Path("o/b.json"))
    assert "--optbench-optimizers=all" in every and "--optbench-harness" in every  # the harness check: nightly only
    sweep = nightly.sweep_command(config, Path("o/sweep.jsonl"))
    assert sweep[-4:] == ["--workload", "tiny", "--optimizers", "adamw"]
    assert compare.thresholds_for("cuda") == compare.DEFAULT_THRESHOLDS["cuda"] != compare.thresholds_for("cpu")


def test_an_optimizer_subset_outside_the_suites_default_collects():
    """`nightly --optimizers sgd`: the suite parametrises only its default optimizers unless told, so the node ids
    `[sgd]` matched nothing and the night ended "the benchmark suite did not run (pytest exit 4)"."""
    import subprocess
    import sys

    config = nightly.NightConfig(device="cpu", preset="smoke", baseline=Path("b"), out=Path("o"),
                                 thresholds=compare.thresholds_for("cpu"), optimizers=("sgd", "adamw"), job_argv=())
    command = [arg for arg in nightly.benchmark_command(config, Path("b.json"))
               if not arg.startswith("--benchmark-json") and arg != "--benchmark-save-data"]
    root = Path(__file__).resolve().parents[1]
    alone = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}  # not an xdist worker
    done = subprocess.run([*command, "--collect-only"], cwd=root, env=alone, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert command[0] == sys.executable and "6 tests collected" in done.stdout
    assert "test_train_step.py::test_train_step[sgd]" in done.stdout


@pytest.mark.parametrize("device, gpus, kind", [("cuda:1", 2, "cuda"), ("auto", 1, "cuda"), ("auto", 0, "cpu"),
                                                ("cpu", 1, "cpu")])
def test_a_nights_limits_and_pre_flight_follow_the_device_it_resolves_to(device, gpus, kind, monkeypatch):
    """`--device auto` on a GPU machine is a GPU night: the GPU's limits and the GPU's pre-flight (it was the
    CPU's limits, and no pre-flight, while only a name starting with "cuda" counted)."""
    from optbench.job import devices

    monkeypatch.setattr(devices, "cuda_device_count", lambda: gpus)
    asked = []
    monkeypatch.setattr(nightly.nvidia, "preflight", lambda mask, run: asked.append(mask) or ([], []))
    assert devices.device_kind(device) == kind
    nightly.night_environment(device)
    assert bool(asked) is (kind == "cuda")


def test_every_job_flag_given_to_nightly_reaches_its_sweep(monkeypatch):
    from optbench.cli.nightly import default_device
    from optbench.cli.options import build_parser, job_argv
    from optbench.job import devices

    argv = ["--workload", "tiny", "--schedule", "cosine", "--batch-size", "4", "--max-memory", "2GiB",
            "--resume-check", "--workload-option", "hidden_size=32"]
    args = build_parser().parse_args(["nightly", "--baseline", "b", "--out", "o", *argv])
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 1)
    default_device(args)  # as nightly_command does first
    again = build_parser().parse_args(["run", *job_argv(args)])  # what the night's `optbench run` parses
    for name in ("workload", "schedule", "batch_size", "max_memory", "resume_check", "workload_option", "device"):
        assert getattr(again, name) == getattr(args, name), name
    assert again.device == "cuda"  # nightly's default device travels with the rest


def test_a_failing_benchmark_test_makes_the_night_red(tmp_path, monkeypatch, capsys):
    """The suite ran (its JSON exists) but one of its own checks failed: regression, baseline kept."""
    records = [_record("adamw")]

    def stage(night, name, command, env=None):
        log = night.config.out / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("FAILED benchmarks/test_optimizer_step.py::test_optimizer_step[adamw]\n1 failed\n")
        if name == "benchmarks":
            _benchmark_json(records, night.config.out / nightly.BENCHMARK_FILE)
            return 1
        append_record(night.config.out / nightly.SWEEP_FILE, records[0])
        return 0

    monkeypatch.setattr(nightly, "_stage", stage)
    monkeypatch.setattr(nightly, "_write_reports", lambda night: None)
    assert _night(tmp_path, "n1") == 1
    summary = (tmp_path / "n1" / "summary.md").read_text()
    assert "REGRESSION" in summary and "a benchmark test failed" in summary and "1 failed" in summary
    assert not (tmp_path / "baseline").exists()  # a red night never becomes the baseline


def test_a_sweep_trial_that_errored_makes_the_night_exit_3(tmp_path, monkeypatch):
    broken = dataclasses.replace(_record("adamw"), status="error", error="RuntimeError: kernel not built")

    def stage(night, name, command, env=None):
        (night.config.out / "logs").mkdir(parents=True, exist_ok=True)
        if name == "benchmarks":
            _benchmark_json([_record("adamw")], night.config.out / nightly.BENCHMARK_FILE)
            return 0
        append_record(night.config.out / nightly.SWEEP_FILE, broken)
        return 3

    monkeypatch.setattr(nightly, "_stage", stage)
    monkeypatch.setattr(nightly, "_write_reports", lambda night: None)
    assert _night(tmp_path, "n1", "--accept") == 3  # not even --accept takes a night with broken trials
    summary = (tmp_path / "n1" / "summary.md").read_text()
    assert "TRIAL FAILURES (1)" in summary and "kernel not built" in summary
    assert not (tmp_path / "baseline").exists()


# --- three real nights (opt-in: about three minutes on 2 CPU cores) ----------------------------------------

E2E = os.environ.get("OPTBENCH_NIGHTLY_E2E") == "1"


@pytest.mark.skipif(not E2E, reason="runs three real nights (minutes): set OPTBENCH_NIGHTLY_E2E=1 (.ci/run does)")
def test_three_nights_on_cpu(tmp_path, monkeypatch, capsys):
    """Night 1 writes the baseline, night 2 (same code) is clean, night 3 (optimizer.step made 20x slower
    by the test knob) is red, names the optimizer, the metric and the change, and keeps the baseline."""
    monkeypatch.chdir(Path(nightly.__file__).parents[2])
    # Timing thresholds here test the baseline machinery, not this machine's noise. On a shared CI box one night's
    # single-process medians moved +111 % (adamw step) and +382 % (adafactor optimizer step) against a same-commit
    # baseline, and a tiny model's RSS peak by +21 MiB. So night 2 (same code) disables the time gate (a slowdown
    # limit no machine reaches: its memory, state and accuracy checks still run), and night 3 puts its signal far
    # from its limit: optimizer.step 20x slower against a 2x limit.
    quick = ["--workload", "tiny", "--optimizers", "adamw,adafactor", "--min-peak-growth", "256"]
    start = time.perf_counter()
    assert _night(tmp_path, "n1", *quick, "--max-slowdown", "100") == 0
    assert (tmp_path / "baseline" / nightly.SWEEP_FILE).is_file()
    night2 = _night(tmp_path, "n2", *quick, "--max-slowdown", "1000000")
    assert night2 == 0, (tmp_path / "n2" / "summary.md").read_text()
    before = (tmp_path / "baseline" / nightly.SWEEP_FILE).read_bytes()
    monkeypatch.setenv("OPTBENCH_TEST_OPTIMIZER_SLOWDOWN", "19.0")
    assert _night(tmp_path, "n3", *quick, "--max-slowdown", "100") == 1
    summary = (tmp_path / "n3" / "summary.md").read_text()
    assert "optbench nightly: REGRESSION" in summary
    assert any(line.startswith("- sweep: adamw [") and "optimizer step +" in line
               for line in summary.splitlines()), summary
    assert (tmp_path / "baseline" / nightly.SWEEP_FILE).read_bytes() == before
    print(f"three nights: {time.perf_counter() - start:.0f} s")
