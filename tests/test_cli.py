"""The command line end to end (subprocesses, tiny BERT, on the CPU): a sweep prints its verdicts and a table that
fits a terminal and writes its full report beside the results; a rerun resumes; `report` tabulates; bad input is
one line and exit 2."""

import json
import warnings

import pandas as pd
import pytest
from _tiny import TINY_ARGS, optbench

from optbench.__main__ import main

TERMINAL_COLUMNS = 120


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "sweep.jsonl"
    return out, optbench("run", *TINY_ARGS, "--out", out)


def test_a_sweep_of_the_three_default_optimizers_records_each_once(sweep):
    out, result = sweep
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["optimizer"] for r in records) == ["adafactor", "adamw", "adamw8bit"]
    assert all(r["status"] == "ok" for r in records), [r["error"] for r in records]
    assert {r["device"] for r in records} == {"cpu"} and all(r["env"]["gpu"] is None for r in records)
    by_name = {r["optimizer"]: r for r in records}
    assert by_name["adamw"]["state_bytes_per_param"] > 8.0 > 2 * by_name["adamw8bit"]["state_bytes_per_param"]
    assert by_name["adafactor"]["state_bytes_per_param"] < 0.5
    # A fresh process per trial: the state allocated after the baseline shows up as RSS growth.
    assert by_name["adamw"]["peak_rss_growth_bytes"] > by_name["adamw"]["state_bytes"] / 2
    assert by_name["adamw"]["paged_state_bytes"] == 0 and by_name["adamw"]["skipped_steps"] == []


def test_the_sweep_prints_verdicts_and_a_table_that_fits_a_terminal(sweep):
    out, result = sweep
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= TERMINAL_COLUMNS, max(lines, key=len)
    assert sum(" ok " in line and "seed=0" in line for line in lines) == 3  # one line per finished trial
    assert "adamw: eval accuracy" in result.stdout and "(the reference)" in result.stdout
    verdicts = [line for line in lines if line.startswith(("adafactor: ", "adamw8bit: "))]
    assert len(verdicts) == 2 and all("vs adamw" in line for line in verdicts)
    (header,) = [line for line in lines if line.startswith("| optimizer")]
    assert "state MiB" in header and "step ms" in header
    assert sum(line.startswith("| adam") or line.startswith("| adafactor") for line in lines) == 3


def test_a_log_gets_plain_progress_lines_and_no_progress_bar_frames(sweep):
    _, result = sweep
    assert "\r" not in result.stderr  # stderr is a pipe here: the trials' tqdm bars stay off
    for i, name in enumerate(["adamw", "adafactor", "adamw8bit"], start=1):
        assert f"optbench: [{i}/3] {name} seed=0 ok in " in result.stderr


def test_the_full_report_is_written_beside_the_results(sweep):
    out, result = sweep
    folder = out.with_suffix("")
    assert f"full report: {folder / 'report.md'}" in result.stdout
    assert (folder / "report.md").read_text().startswith("### tiny-bert")
    summary = pd.read_csv(folder / "summary.csv").set_index("optimizer")
    assert summary.loc["adamw", "mem saved % vs adamw"] == pytest.approx(0.0)
    beside = next(line for line in result.stdout.splitlines() if line.startswith("beside it: "))
    assert all((folder / name.strip()).is_file() for name in beside.removeprefix("beside it: ").split(","))


def test_a_rerun_resumes_and_report_tabulates(sweep, tmp_path):
    out, _ = sweep
    again = optbench("run", *TINY_ARGS, "--no-figures", "--out", out)  # resume: everything is already ok
    assert again.returncode == 0, again.stderr
    assert len(out.read_text().splitlines()) == 3
    report = optbench("report", out, "--out-dir", tmp_path)
    assert report.returncode == 0, report.stderr
    assert "| adamw8bit" in report.stdout and "state B/param" in report.stdout
    assert (tmp_path / "report.md").read_text().startswith("### tiny-bert")


def test_list_shows_every_optimizer():
    result = optbench("list")
    assert result.returncode == 0
    for name in ("adamw", "adafactor", "adamw8bit", "adamw_bnb_8bit", "int8-blockwise"):
        assert name in result.stdout


@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "ok.csv").write_text("review,y\ngood,1\nbad,0\n")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    (tmp_path / "notes.jsonl").write_text("hello\nworld\n")
    return tmp_path


@pytest.mark.parametrize("args,message", [
    (["run", "--optimizers", "adamw,sgdx"], "unknown optimizer 'sgdx'"),
    (["run", "--steps", "0"], "must be positive"),
    (["run", "--steps", "ten"], "expected a whole number"),
    (["run", "--batch-size", "-4"], "must be positive"),
    (["run", "--lr", "nan"], "positive finite"),
    (["run", "--seeds", "0,x"], "comma-separated integers"),
    (["run", "--workload", "huge"], "unknown workload 'huge'"),
    (["run", "--dataset", "missing.csv"], "dataset file not found"),
    (["run", "--dataset", "{tmp}/broken.parquet"], "cannot read dataset file"),
    (["run", "--dataset", "{tmp}/ok.csv", "--text-column", "review"], "no column 'label'"),
    (["run", "--dataset", "user/some-dataset"], "offline default is the embedded dataset"),
    (["run", "--model", "some-org/some-model"], "offline default is --workload minilm"),
    (["run", "--model", "./no/such/dir"], "model path not found"),
    (["run", "--steps", "4", "--warmup-steps", "9"], "--warmup-steps must be in"),
    (["run", "--preset", "huge"], "invalid choice"),
    (["report", "{tmp}/nothing.jsonl"], "no such results file"),
    (["report", "{tmp}/notes.jsonl"], "not a JSON line"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(bad_files, args, message, capfd, monkeypatch):
    """In this process (fd-level capture, so library prints count); the subprocess test below shows the same
    holds for `python -m optbench` as a whole."""
    argv = [a.format(tmp=bad_files) for a in args]
    if argv[0] == "run":
        argv += ["--device", "cpu", "--out", str(bad_files / "r.jsonl")]  # about the input, on any machine
    monkeypatch.chdir(bad_files)
    code = main(argv)
    err = capfd.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("optbench: error: ") and message in lines[0], err
    assert not (bad_files / "r.jsonl").exists()


@pytest.mark.parametrize("args,message", [(["frobnicate"], "invalid choice"),
                                          (["run", "--model", "some-org/some-model", "--device", "cpu"],
                                           "offline default is --workload minilm")])
def test_bad_input_to_the_command_line_process_has_no_traceback(bad_files, args, message):
    result = optbench(*args, cwd=bad_files)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [next(line for line in result.stderr.splitlines() if message in line)]


def test_a_sweeps_end_summarises_its_records_once(tmp_path, monkeypatch, capsys):
    """The report files and the terminal's verdicts come from one summary of the results file."""
    from types import SimpleNamespace

    from _study_fixture import study_records

    from optbench.cli.sweeping import finish
    from optbench.records.record import append_record
    from optbench.report import render

    out = tmp_path / "study.jsonl"
    for record in study_records():
        append_record(out, record)
    calls = []
    summarize = render.summarize
    monkeypatch.setattr(render, "summarize", lambda *args, **kwargs: calls.append(1) or summarize(*args, **kwargs))
    finish(SimpleNamespace(no_figures=True, margin=None), out)
    assert len(calls) == 1
    printed = capsys.readouterr().out
    assert (tmp_path / "study" / "report.md").is_file() and "full report: " in printed


def test_a_one_step_job_with_a_seed_given_twice_runs_one_trial_and_says_it_timed_no_step(tmp_path):
    """A one-step job's only step is the warm-up, which timing leaves out: the trial is recorded, and the line printed
    for it says so rather than failing on the missing step time. A seed given twice is one trial, not two seeds."""
    out = tmp_path / "one.jsonl"
    args = [a if a != "3" else "1" for a in TINY_ARGS]  # --steps 1
    args[args.index("--warmup-steps") + 1] = "0"
    result = optbench("run", *args, "--optimizers", "adamw", "--seeds", "0,0", "--no-figures", "--out", out)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 1 and records[0]["status"] == "ok" and records[0]["step_time_median_s"] is None
    assert "no timed step" in next(line for line in result.stdout.splitlines() if "seed=0" in line)
    assert "optbench: warning: '0,0' gives 0 more than once: each runs once" in result.stderr.splitlines()


def test_an_eval_size_past_the_held_out_rows_is_said_and_the_record_counts_the_rows_evaluated(tmp_path):
    """Every held-out row is evaluated and `eval_rows` says how many; the user who asked for more is told, in one
    line before any trial (the preset's own size is not: it must serve small datasets too)."""
    out = tmp_path / "big-eval.jsonl"
    args = list(TINY_ARGS)
    args[args.index("--eval-size") + 1] = "100000"
    result = optbench("run", *args, "--optimizers", "adamw", "--no-figures", "--out", out)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    warned = [line for line in result.stderr.splitlines() if "warning: --eval-size" in line]
    assert warned == ["optbench: warning: --eval-size 100000 is more than the 4000 held-out rows this job has: all "
                      "4000 are evaluated (the record's eval_rows)"]
    record = json.loads(out.read_text().splitlines()[0])
    assert record["eval_size"] == 100000 and record["eval_rows"] == 4000


@pytest.mark.parametrize("args", [["list"], ["estimate", "--params", "7B"]])
def test_a_reader_that_went_away_ends_the_command_with_141_and_no_traceback(args, tmp_path):
    """`optbench list | head`: stdout's reader is gone before the command writes (its pipe's read end is closed
    before it starts, so this does not depend on timing), which a shell reports as SIGPIPE, 141."""
    import os

    from _tiny import started

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        with open(tmp_path / "err.txt", "w") as err, started(args, stdout=write_end, stderr=err) as process:
            code = process.wait(timeout=120)
    finally:
        os.close(write_end)
    assert code == 141, (tmp_path / "err.txt").read_text()
    assert (tmp_path / "err.txt").read_text() == ""


def test_list_options_drop_repeats_keep_order_and_say_so():
    """A seed or an lr given twice would be one trial recorded twice, counted twice in an interval: it runs once, and
    the user who typed it twice is told."""
    from optbench.cli.argtypes import float_list, int_list

    with pytest.warns(UserWarning, match=r"^'3,1,3,' gives 3 more than once: each runs once$"):
        assert int_list("3,1,3,") == [3, 1]
    with pytest.warns(UserWarning, match=r"^'1e-3,0.001,2e-3' gives 0.001 more than once"):
        assert float_list("1e-3,0.001,2e-3") == [1e-3, 2e-3]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert int_list("0,1,2") == [0, 1, 2]


def test_an_optimizer_named_twice_runs_once_and_is_said():
    """Two spellings of one entry (its name and an HF alias) are one trial per seed, said in one warning."""
    from optbench.job import planner

    with pytest.warns(UserWarning, match=r"^--optimizers names adafactor more than once \(an alias counts as its "):
        assert planner.resolve_names(["adafactor", "adamw", "adafactor_hf"]) == ["adafactor", "adamw"]


def test_an_eval_interval_past_the_last_step_is_clamped_and_said():
    from optbench.job import planner
    from optbench.job.spec import PRESETS

    with pytest.warns(UserWarning, match=r"^--eval-every 500 is more than the 40 steps: the curve is evaluated at "
                                         r"step 40 only$"):
        settings = planner.job_settings({"steps": 40, "eval_every": 500}, PRESETS["smoke"])
    assert settings["eval_every"] == 40


def test_a_warning_of_optbench_is_one_line_said_once_however_many_tables_read_it(tmp_path, capfd):
    """The report draws its tables from the records more than once; a warning raised while reading them (here: one
    job's adamw at two lrs) printed as a UserWarning with its source line, three times."""
    from optbench.records.record import Record, append_record

    out = tmp_path / "mixed.jsonl"
    for seed, lr in ((0, 1e-3), (0, 1e-2), (1, 1e-2)):
        append_record(out, Record(trial_id=f"t{seed}-{lr}", optimizer="adamw", seed=seed, lr=lr, status="ok",
                                  workload="tiny", model="m", dataset="d", device="cpu", steps=4, eval_accuracy=0.9,
                                  eval_metrics={"accuracy": 0.9}, state_bytes=1, peak_memory_bytes=1))
    assert main(["report", str(out), "--out-dir", str(tmp_path / "report")]) == 0
    warned = [line for line in capfd.readouterr().err.splitlines() if "ran at lr" in line]
    assert len(warned) == 1 and warned[0].startswith("optbench: warning: adamw ran at lr 0.001 and at lr 0.01"), warned


def test_a_dataset_file_edited_under_its_name_is_a_new_trial_not_one_already_ok(tmp_path):
    """The trial id held the file's name only: rerunning into the same --out after editing the file reported the old
    rows' trial "already ok" and trained nothing. Now the file's content is in the id and in the job, so the edited
    file's trial runs and the two contents are two jobs in the report."""
    data, out = tmp_path / "reviews.csv", tmp_path / "r.jsonl"
    rows = [f"review {word} {i},{i % 2}" for i in range(60) for word in ("good" if i % 2 else "bad",)]
    data.write_text("text,label\n" + "\n".join(rows) + "\n")
    args = ["run", *TINY_ARGS, "--optimizers", "adamw", "--dataset", str(data), "--no-figures", "--out", str(out)]
    assert optbench(*args).returncode == 0
    data.write_text("text,label\n" + "\n".join(rows[:50]) + "\n")
    again = optbench(*args)
    assert again.returncode == 0, again.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert records[0]["trial_id"] != records[1]["trial_id"]
    assert records[0]["dataset_sha256"] != records[1]["dataset_sha256"] and len(records[1]["dataset_sha256"]) == 64
    assert records[0]["job_key"] != records[1]["job_key"]


@pytest.mark.parametrize("command", ["run", "study", "nightly", "explain"])
def test_the_help_of_workload_names_every_workload(command, capsys):
    """`custom` was accepted by every command and named in no help."""
    from optbench.workloads import WORKLOADS

    with pytest.raises(SystemExit):
        main([command, "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    said = help_text[help_text.index("--workload WORKLOAD "):][:300]  # its help, not the usage line
    assert all(name in said for name in WORKLOADS), said
