"""`optbench compare`: regressions in time, memory, accuracy and status; the github-action-benchmark export;
bad input. Runs the CLI in-process on hand-written results files (no torch needed)."""

import dataclasses
import json

import pytest

from optbench.__main__ import main
from optbench.results import Record, append_record

MIB = 2**20
JOB = dict(model="m", dataset="d", device="cpu", steps=10, batch_size=4, seq_len=8, workload="w")


def _ok(optimizer, precision, state_mib, growth_mib, step_s, acc):
    return Record(trial_id=f"t-{optimizer}", optimizer=optimizer, status="ok", state_precision=precision,
                  state_bytes=int(state_mib * MIB), state_bytes_per_param=1.0,
                  peak_rss_bytes=int((1000 + growth_mib) * MIB), peak_rss_growth_bytes=int(growth_mib * MIB),
                  step_time_median_s=step_s, optimizer_step_median_s=step_s / 4, eval_accuracy=acc, **JOB)


BASE = [_ok("adamw", "fp32", 100, 400, 0.200, 0.90), _ok("adamw8bit", "int8-blockwise", 25, 300, 0.400, 0.88)]


def _write(path, records):
    for record in records:
        append_record(path, record)
    return path


def _doctored(path, optimizer, **changes):
    """BASE with one optimizer's record changed."""
    records = [dataclasses.replace(r, **changes) if r.optimizer == optimizer else r for r in BASE]
    return _write(path, records)


@pytest.fixture
def base(tmp_path):
    return _write(tmp_path / "base.jsonl", BASE)


def test_same_file_twice_passes(base, capsys):
    assert main(["compare", str(base), str(base)]) == 0
    out = capsys.readouterr().out
    assert "| adamw8bit" in out and "+0.0 %" in out and "Regressions" not in out


def test_twenty_percent_slower_fails_naming_the_row(base, tmp_path, capsys):
    slower = _doctored(tmp_path / "new.jsonl", "adamw8bit", step_time_median_s=0.480)
    assert main(["compare", str(base), str(slower)]) == 1
    out = capsys.readouterr().out
    assert "adamw8bit [m on d, cpu, 10 steps x batch 4 x seq 8]: step time +20.0 % (limit 10 %)" in out
    assert "- adamw [" not in out  # the untouched optimizer is not named
    assert main(["compare", str(base), str(slower), "--max-slowdown", "25%"]) == 0


def test_optimizer_step_slowdown_is_a_regression_too(base, tmp_path, capsys):
    slower = _doctored(tmp_path / "new.jsonl", "adamw", optimizer_step_median_s=0.075)  # base 0.050
    assert main(["compare", str(base), str(slower)]) == 1
    assert "- adamw [m on d, cpu, 10 steps x batch 4 x seq 8]: optimizer step +50.0 %" in capsys.readouterr().out


@pytest.mark.parametrize("changes,message", [
    (dict(peak_rss_growth_bytes=int(440 * MIB)), "peak memory +10.0 % (limit 5 %)"),
    (dict(state_bytes=int(110 * MIB)), "state +10.0 % (limit 5 %)"),
])
def test_memory_growth_is_detected(base, tmp_path, capsys, changes, message):
    bigger = _doctored(tmp_path / "new.jsonl", "adamw", **changes)
    assert main(["compare", str(base), str(bigger)]) == 1
    assert message in capsys.readouterr().out
    assert main(["compare", str(base), str(bigger), "--max-memory-growth", "12"]) == 0


def test_accuracy_drop_in_points(base, tmp_path, capsys):
    worse = _doctored(tmp_path / "new.jsonl", "adamw8bit", eval_accuracy=0.86)
    assert main(["compare", str(base), str(worse)]) == 1
    assert "eval accuracy -2.0 pts (limit -1 pts)" in capsys.readouterr().out
    assert main(["compare", str(base), str(worse), "--max-accuracy-drop", "2.5"]) == 0
    better = _doctored(tmp_path / "better.jsonl", "adamw8bit", eval_accuracy=0.95)
    assert main(["compare", str(base), str(better)]) == 0


def test_a_trial_that_failed_or_vanished_is_a_regression(base, tmp_path, capsys):
    oom = _doctored(tmp_path / "oom.jsonl", "adamw8bit", status="oom", error="CUDA out of memory")
    assert main(["compare", str(base), str(oom)]) == 1
    assert "adamw8bit [" in (out := capsys.readouterr().out) and "was ok, now oom" in out
    gone = _write(tmp_path / "gone.jsonl", BASE[:1])
    assert main(["compare", str(base), str(gone)]) == 1
    assert "was ok, now missing" in capsys.readouterr().out
    assert main(["compare", str(gone), str(base)]) == 0  # a new optimizer is news, not a regression


def test_export_for_github_action_benchmark(base, tmp_path, capsys):
    out = tmp_path / "gh" / "bench.json"
    assert main(["compare", str(base), str(base), "--export-github-benchmark", str(out)]) == 0
    smaller = json.loads(out.read_text())
    bigger = json.loads((tmp_path / "gh" / "bench-accuracy.json").read_text())
    job = "m on d, cpu, 10 steps x batch 4 x seq 8"
    by_name = {entry["name"]: entry for entry in smaller}
    assert by_name[f"adamw: step time ({job})"] == {"name": f"adamw: step time ({job})", "unit": "ms",
                                                     "value": 200.0}
    assert by_name[f"adamw8bit: state ({job})"]["value"] == 25.0 and by_name[f"adamw8bit: state ({job})"][
        "unit"] == "MiB"
    assert by_name[f"adamw: peak memory ({job})"]["value"] == 400.0
    assert {e["unit"] for e in smaller} == {"ms", "MiB"} and len(smaller) == 8  # 4 metrics x 2 optimizers
    assert bigger == [{"name": f"adamw: eval accuracy ({job})", "unit": "%", "value": 90.0},
                      {"name": f"adamw8bit: eval accuracy ({job})", "unit": "%", "value": 88.0}]


@pytest.fixture
def bad_inputs(tmp_path):
    (tmp_path / "notes.json").write_text("hello")
    (tmp_path / "other.json").write_text(json.dumps({"results": []}))
    (tmp_path / "empty").mkdir()
    _write(tmp_path / "elsewhere.jsonl", [dataclasses.replace(r, steps=99) for r in BASE])
    return tmp_path


@pytest.mark.parametrize("args,message", [
    (["{tmp}/nothing.jsonl", "{base}"], "no such results file"),
    (["{base}", "{tmp}/nothing.json"], "no such benchmark file"),
    (["{base}", "{tmp}/notes.json"], "not a JSON file"),
    (["{base}", "{tmp}/other.json"], "not pytest-benchmark JSON"),
    (["{base}", "{tmp}/empty"], "no pytest-benchmark *.json files"),
    (["{base}", "{tmp}/elsewhere.jsonl"], "share no job"),
    (["{base}", "{base}", "--max-slowdown", "ten%"], "expected a number"),
    (["{base}", "{base}", "--max-memory-growth=-5%"], "finite number >= 0"),
    (["{base}", "{base}", "--max-accuracy-drop", "inf"], "finite number >= 0"),
    (["{base}"], "required: new"),
])
def test_bad_input_is_one_line_and_exit_2(base, bad_inputs, capsys, args, message):
    argv = ["compare", *[a.format(tmp=bad_inputs, base=base) for a in args]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
