"""The command line end to end (subprocesses, tiny BERT) and every kind of bad input."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

TINY_RUN = ["--workload", "tiny", "--device", "cpu", "--steps", "4", "--warmup-steps", "1", "--batch-size", "4",
            "--seq-len", "16", "--eval-size", "16"]


def optbench(*args, cwd=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "optbench", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=600)


def test_sweep_of_the_three_optimizers_then_report(tmp_path):
    out = tmp_path / "sweep.jsonl"
    result = optbench("run", *TINY_RUN, "--out", out)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["optimizer"] for r in records) == ["adafactor", "adamw", "adamw8bit"]
    assert all(r["status"] == "ok" for r in records), [r["error"] for r in records]
    by_name = {r["optimizer"]: r for r in records}
    assert by_name["adamw"]["state_bytes_per_param"] > 8.0 > 2 * by_name["adamw8bit"]["state_bytes_per_param"]
    assert by_name["adafactor"]["state_bytes_per_param"] < 0.5
    # A fresh process per trial: the state allocated after the baseline shows up as RSS growth.
    assert by_name["adamw"]["peak_rss_growth_bytes"] > by_name["adamw"]["state_bytes"] / 2
    assert result.stdout.count(" ok ") >= 3  # one summary line per trial

    again = optbench("run", *TINY_RUN, "--out", out)  # resume: everything is already ok
    assert again.returncode == 0 and len(out.read_text().splitlines()) == 3

    report = optbench("report", out, "--out-dir", tmp_path)
    assert report.returncode == 0, report.stderr
    assert "| adamw8bit" in report.stdout and "state B/param" in report.stdout
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary.set_index("optimizer").loc["adamw", "mem saved % vs adamw"] == pytest.approx(0.0)
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
def test_bad_input_is_one_line_and_exit_2(bad_files, args, message):
    result = optbench(*[a.format(tmp=bad_files) for a in args], cwd=bad_files)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr
