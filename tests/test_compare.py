"""`optbench compare`: regressions in time, memory, accuracy and status; the github-action-benchmark export;
bad input. Runs the CLI in-process on hand-written results files (no torch needed)."""

import dataclasses
import json

import numpy as np
import pytest
from scipy import stats as scipy_stats

from optbench.__main__ import main
from optbench.records.record import Record, append_record, read_records
from optbench.report import compare, compare_table, environments, metrics, noise

MIB = 2**20
JOB = dict(model="m", dataset="d", device="cpu", steps=10, batch_size=4, seq_len=8, workload="w")
LABEL = "m on d, cpu, 10 steps x batch 4 x seq 8, linear lr"  # report.frame.job_label of JOB


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
    assert main(["compare", str(base), str(slower), "--max-slowdown", "10"]) == 1
    out = capsys.readouterr().out
    assert f"adamw8bit [{LABEL}]: step time +20.0 % (limit 10 %)" in out
    assert "- adamw [" not in out  # the untouched optimizer is not named
    assert main(["compare", str(base), str(slower), "--max-slowdown", "25%"]) == 0


def test_optimizer_step_slowdown_is_a_regression_too(base, tmp_path, capsys):
    slower = _doctored(tmp_path / "new.jsonl", "adamw", optimizer_step_median_s=0.075)  # base 0.050
    assert main(["compare", str(base), str(slower), "--max-slowdown", "10"]) == 1
    assert f"- adamw [{LABEL}]: optimizer step +50.0 %" in capsys.readouterr().out


@pytest.mark.parametrize("changes,message", [
    (dict(peak_rss_growth_bytes=int(440 * MIB)), "peak memory +10.0 % (limit 5 %)"),  # +40 MiB: past 5 % ...
    (dict(state_bytes=int(110 * MIB)), "state +10.0 % (limit 5 %)"),
])
def test_memory_growth_is_detected(base, tmp_path, capsys, changes, message):
    bigger = _doctored(tmp_path / "new.jsonl", "adamw", **changes)
    if "peak_rss_growth_bytes" in changes:  # ... but inside the CPU's 64 MiB RSS-jitter floor
        assert main(["compare", str(base), str(bigger)]) == 0
        capsys.readouterr()
    floor = ["--min-peak-growth", "16"] if "peak_rss_growth_bytes" in changes else []
    assert main(["compare", str(base), str(bigger), *floor]) == 1
    assert message in capsys.readouterr().out
    assert main(["compare", str(base), str(bigger), "--max-memory-growth", "12", *floor]) == 0


def test_accuracy_drop_in_points(base, tmp_path, capsys):
    worse = _doctored(tmp_path / "new.jsonl", "adamw8bit", eval_accuracy=0.86)
    assert main(["compare", str(base), str(worse)]) == 1
    assert "eval accuracy -2.0 pts (limit -1 pts)" in capsys.readouterr().out
    assert main(["compare", str(base), str(worse), "--max-accuracy-drop", "2.5"]) == 0
    better = _doctored(tmp_path / "better.jsonl", "adamw8bit", eval_accuracy=0.95)
    assert main(["compare", str(base), str(better)]) == 0


def test_a_side_at_chance_has_no_accuracy_to_compare_and_falling_to_it_is_a_regression(tmp_path, capsys):
    """Chance 0.5: adamw at 0.505 on both sides never trained, so neither side has a figure and nothing is gated on
    them (the cell says so); adamw8bit trained in BASE (0.88) and sits at chance in NEW: a regression in words."""
    chance = [dataclasses.replace(r, metric_chance=0.5) for r in BASE]
    base = _write(tmp_path / "base.jsonl", [dataclasses.replace(r, eval_accuracy=0.505) if r.optimizer == "adamw"
                                            else r for r in chance])
    new = _write(tmp_path / "new.jsonl", [dataclasses.replace(r, eval_accuracy=0.505) for r in chance])
    assert main(["compare", str(base), str(new)]) == 1
    out = capsys.readouterr().out
    adamw = next(line for line in out.splitlines() if line.startswith("| adamw "))
    assert "untrained → untrained" in adamw and adamw.rstrip(" |").endswith("ok")
    assert f"- adamw8bit [{LABEL}]: eval accuracy was 88 %, now untrained (at chance)" in out
    assert main(["compare", str(new), str(base)]) == 0  # from chance to trained: news, not a regression
    assert "untrained → 88.0" in capsys.readouterr().out


def test_a_trial_that_failed_or_vanished_is_a_regression(base, tmp_path, capsys):
    oom = _doctored(tmp_path / "oom.jsonl", "adamw8bit", status="oom", error="CUDA out of memory")
    assert main(["compare", str(base), str(oom)]) == 1
    assert "adamw8bit [" in (out := capsys.readouterr().out) and "was ok, now oom" in out
    gone = _write(tmp_path / "gone.jsonl", BASE[:1])
    assert main(["compare", str(base), str(gone)]) == 1
    assert "was ok, now missing" in capsys.readouterr().out
    assert main(["compare", str(gone), str(base)]) == 0  # a new optimizer is news, not a regression


def test_an_optimizer_trained_at_another_lr_is_a_warning_in_the_header(tmp_path, capsys):
    """A run at the registry's lr against a study's finals at their tuned lr compared as one job, silently."""
    base = _doctored(tmp_path / "base.jsonl", "adamw", lr=5e-5)
    new = _doctored(tmp_path / "new.jsonl", "adamw", lr=3e-4)
    assert main(["compare", str(base), str(new)]) == 0
    out = capsys.readouterr().out
    assert ("**Warning: adamw trained at lr 5e-05 in BASE and 0.0003 in NEW: its changes are the lr's as much as "
            "the code's.**") in out
    assert "adamw8bit trained at" not in out  # its lr did not change


def test_export_for_github_action_benchmark(base, tmp_path, capsys):
    out = tmp_path / "gh" / "bench.json"
    assert main(["compare", str(base), str(base), "--export-github-benchmark", str(out)]) == 0
    smaller = json.loads(out.read_text())
    bigger = json.loads((tmp_path / "gh" / "bench-accuracy.json").read_text())
    job = LABEL
    by_name = {entry["name"]: entry for entry in smaller}
    assert by_name[f"adamw: step time ({job})"] == {"name": f"adamw: step time ({job})", "unit": "ms",
                                                     "value": 200.0}
    assert by_name[f"adamw8bit: state ({job})"]["value"] == 25.0 and by_name[f"adamw8bit: state ({job})"][
        "unit"] == "MiB"
    assert by_name[f"adamw: peak memory ({job})"]["value"] == 400.0
    assert {e["unit"] for e in smaller} == {"ms", "MiB"} and len(smaller) == 8  # 4 metrics x 2 optimizers
    assert bigger == [{"name": f"adamw: eval accuracy ({job})", "unit": "%", "value": 90.0},
                      {"name": f"adamw8bit: eval accuracy ({job})", "unit": "%", "value": 88.0}]


def test_every_optimizer_of_the_job_lost_is_a_regression_not_another_job(base, tmp_path, capsys):
    """NEW ran the same job with an optimizer BASE lacks: compare said "share no job" (exit 2), naming one label twice,
    though losing one optimizer of two is a regression (exit 1) and losing both is no less of one."""
    other = _write(tmp_path / "new.jsonl", [_ok("sgd", "fp32", 0, 200, 0.1, 0.8)])
    assert main(["compare", str(base), str(other)]) == 1
    out = capsys.readouterr().out
    assert f"adamw [{LABEL}]: was ok, now missing" in out and f"adamw8bit [{LABEL}]: was ok, now missing" in out


@pytest.fixture
def bad_inputs(tmp_path):
    (tmp_path / "notes.json").write_text("hello")
    (tmp_path / "other.json").write_text(json.dumps({"results": []}))
    (tmp_path / "empty").mkdir()
    (tmp_path / "blank.jsonl").write_text("")
    (tmp_path / "latin1.jsonl").write_bytes(b"\xff\xfe")
    _write(tmp_path / "elsewhere.jsonl", [dataclasses.replace(r, steps=99) for r in BASE])
    _write(tmp_path / "alike.jsonl", [dataclasses.replace(r, eval_size=7) for r in BASE])  # not in the label
    _write(tmp_path / "mine-accuracy.jsonl", BASE)  # where an export to mine.jsonl puts its accuracy half
    return tmp_path


@pytest.mark.parametrize("args,message", [
    (["{tmp}/nothing.jsonl", "{base}"], "no such results file"),
    (["{base}", "{tmp}/nothing.json"], "no such benchmark file"),
    (["{base}", "{tmp}/notes.json"], "not a JSON file"),
    (["{base}", "{tmp}/other.json"], "not pytest-benchmark JSON"),
    (["{base}", "{tmp}/empty"], "no results files (*.jsonl) in it and no pytest-benchmark JSON"),
    (["{base}", "{tmp}/elsewhere.jsonl"], "share no job"),
    # two labels that read alike: the message printed the same label twice
    (["{base}", "{tmp}/alike.jsonl"], "; they differ in eval_size (0 vs 7)"),
    (["{base}", "{base}", "--max-slowdown", "ten%"], "expected a number"),
    (["{base}", "{base}", "--max-memory-growth=-5%"], "finite number >= 0"),
    (["{base}", "{base}", "--max-accuracy-drop", "inf"], "finite number >= 0"),
    (["{base}"], "required: new"),
    # an empty history was used as none, silently
    (["--noise-history", "{tmp}/blank.jsonl", "--", "{base}", "{base}"], "no records in --noise-history"),
    # a folder to export to was refused only after the comparison printed: exit 2 would hide a regression's 1
    (["{base}", "{base}", "--export-github-benchmark", "{tmp}/empty"], "it is a folder"),
    (["{base}", "{base}", "--export-github-benchmark", "{base}/x.json"], "a file, not a folder"),
    # an export named like a results file replaced its records with the export, and the file read no more
    (["{base}", "{base}", "--export-github-benchmark", "{base}"], "it is one of this command's inputs"),
    (["{base}", "{base}", "--export-github-benchmark", "{tmp}/elsewhere.jsonl"], "it holds optbench records"),
    (["{base}", "{base}", "--export-github-benchmark", "{tmp}/mine.jsonl"], "mine-accuracy.jsonl: it holds optbench"),
    (["{base}", "{tmp}/latin1.jsonl"], "latin1.jsonl: not UTF-8 text"),  # the file was not named
])
def test_bad_input_is_one_line_and_exit_2(base, bad_inputs, capsys, args, message):
    argv = ["compare", *[a.format(tmp=bad_inputs, base=base) for a in args]]
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert captured.out == ""  # refused before any comparison is printed
    assert [r.trial_id for r in read_records(base)] == [r.trial_id for r in BASE]  # nothing read was overwritten


# --- noise-aware verdicts: per-step samples, seeds, environments ------------------------------------

def _timed(optimizer, samples_s, seed=0, acc=0.9, **changes):
    """An ok record whose step and optimizer-step samples are `samples_s` (medians filled to match)."""
    record = dataclasses.replace(_ok(optimizer, "fp32", 100, 400, 0.2, acc), trial_id=f"t-{optimizer}-{seed}",
                                 seed=seed, step_time_samples_s=list(samples_s),
                                 optimizer_step_samples_s=[s / 4 for s in samples_s])
    record.step_time_median_s = float(np.median(samples_s))
    record.optimizer_step_median_s = record.step_time_median_s / 4
    return dataclasses.replace(record, **changes)


def _noisy(n, scale=1.0, spread=0.05, seed=0):
    """Step times around 0.2 s * scale with a relative (log-normal) spread, as a shared machine produces them."""
    return list(0.2 * scale * np.exp(spread * np.random.default_rng(seed).standard_normal(n)))


def _runs(n, scale=1.0, between=0.03, within=0.05, seed=0, steps=30):
    """n processes (seeds) of one optimizer: each run's level drawn around 0.2 s * scale with a relative spread
    `between` (what a whole process shifts by), its steps around that level with a relative spread `within`."""
    rng = np.random.default_rng(seed)
    levels = scale * np.exp(between * rng.standard_normal(n))
    return [_timed("adamw", list(level * np.array(_noisy(steps, spread=within, seed=seed * 100 + i))), seed=i)
            for i, level in enumerate(levels)]


def test_the_interval_is_student_t_on_the_log_process_medians_pooled_within_groups():
    base, new = [1.00, 1.02, 0.98], [1.30, 1.27, 1.33]
    found = noise.change(base, new)
    logs_b, logs_n = np.log(base), np.log(new)
    pooled = np.sqrt((((logs_b - logs_b.mean()) ** 2).sum() + ((logs_n - logs_n.mean()) ** 2).sum()) / 4)
    half = scipy_stats.t.ppf(0.975, 4) * pooled * np.sqrt(2 / 3)
    diff = logs_n.mean() - logs_b.mean()
    assert found.ratio == pytest.approx(np.exp(diff)) and found.runs == (3, 3) and found.basis == "between-run"
    assert (found.low, found.high) == pytest.approx((np.exp(diff - half), np.exp(diff + half)))
    assert found.between_run == pytest.approx(pooled)
    assert noise.change([1.0, 1.1], [1.2, 1.3]).low is None  # two runs a side: no interval
    assert noise.change([1.0], [1.3]).basis == "too few runs"


def test_one_run_per_side_has_no_interval_and_the_threshold_decides(tmp_path, capsys):
    base = _write(tmp_path / "a.jsonl", _runs(1, seed=1))
    slow = _write(tmp_path / "b.jsonl", _runs(1, scale=1.4, seed=2))
    assert main(["compare", str(base), str(slow)]) == 1  # +40 % against the CPU's 25 %, no interval
    out = capsys.readouterr().out
    assert "no CI: too few runs; runs 1+1, within-run ±" in out
    line = next(x for x in out.splitlines() if x.startswith("- adamw [") and "optimizer step" in x)
    assert "95 % CI" not in line and "(limit 25 %)" in line


def test_three_runs_per_side_give_an_interval_from_their_spread_not_from_their_steps(tmp_path, capsys):
    """Steps spread 20 % inside each run, runs 2 % between one another: the interval is as narrow as the runs
    agree, and both spreads are shown."""
    base = _write(tmp_path / "a.jsonl", _runs(3, between=0.02, within=0.2, seed=1))
    slow = _write(tmp_path / "b.jsonl", _runs(3, scale=1.45, between=0.02, within=0.2, seed=2))
    comparison = compare.compare(compare_records(base), compare_records(slow), compare.DEFAULT_THRESHOLDS["cpu"])
    (row,) = comparison.rows.itertuples()
    assert row.step_ms_low > 25 and row.step_ms_test == "between-run" and row.step_ms_runs == "3+3"
    assert row.step_ms_between_run < 5 < 10 < row.step_ms_within_run
    assert main(["compare", str(base), str(slow)]) == 1
    out = capsys.readouterr().out
    assert "runs 3+3, between-run ±" in out and "within-run ±" in out


def test_runs_that_disagree_are_noise_however_steady_each_run_was(tmp_path):
    """One commit twice: runs shifted 8 % from one another, steps within a run 1 % apart. A bootstrap over one
    run's steps would call such a shift real; between runs it is within noise."""
    base = _write(tmp_path / "a.jsonl", _runs(3, between=0.08, within=0.01, seed=5))
    again = _write(tmp_path / "b.jsonl", _runs(3, between=0.08, within=0.01, seed=6))
    comparison = compare.compare(compare_records(base), compare_records(again), compare.Thresholds(5.0))
    (row,) = comparison.rows.itertuples()
    assert row.step_ms_low < 0 < row.step_ms_high and comparison.regressions == []


def test_a_recorded_history_of_same_commit_runs_makes_the_interval_of_single_runs(tmp_path):
    history = [dataclasses.replace(r, env={"git_commit": commit}, trial_id=f"{commit}-{r.trial_id}")
               for commit, scale in (("a", 1.0), ("b", 1.5))  # two commits far apart: not noise, not pooled
               for r in _runs(4, scale=scale, between=0.02, seed=ord(commit))]
    base, slow = _runs(1, seed=7), _runs(1, scale=1.4, seed=8)
    without = compare.compare(base, slow, compare.Thresholds(10.0))
    with_history = compare.compare(base, slow, compare.Thresholds(10.0), history)
    (row,) = without.rows.itertuples()
    assert row.step_ms_low is None and row.step_ms_test == "threshold"
    (row,) = with_history.rows.itertuples()
    assert row.step_ms_test == "between-run + history" and 10 < row.step_ms_low < row.step_ms_delta
    assert row.step_ms_between_run < 4  # the two commits' 50 % apart stayed out of the spread


def test_a_folder_of_runs_is_one_side(tmp_path, capsys):
    runs = tmp_path / "base"
    runs.mkdir()
    for i, record in enumerate(_runs(3, seed=3)):
        _write(runs / f"run-{i}.jsonl", [record])
    slow = _write(tmp_path / "b.jsonl", _runs(3, scale=1.5, seed=4))
    assert main(["compare", str(runs), str(slow)]) == 1
    assert "runs 3+3" in capsys.readouterr().out


def compare_records(path):
    return read_records(path)


def test_paired_accuracy_over_seeds(tmp_path, capsys):
    base_acc, new_acc = [0.90, 0.88, 0.92], [0.86, 0.84, 0.885]  # every seed ~3.5 pts worse
    base = _write(tmp_path / "a.jsonl", [_timed("adamw", _noisy(10), seed=s, acc=a) for s, a in enumerate(base_acc)])
    new = _write(tmp_path / "b.jsonl", [_timed("adamw", _noisy(10), seed=s, acc=a) for s, a in enumerate(new_acc)])
    assert main(["compare", str(base), str(new)]) == 1
    assert "eval accuracy -3.8 pts, 95 % CI" in capsys.readouterr().out
    mixed = _write(tmp_path / "c.jsonl", [_timed("adamw", _noisy(10), seed=s, acc=a)
                                          for s, a in enumerate([0.93, 0.84, 0.905])])  # -0.8 pts on average
    assert main(["compare", str(base), str(mixed)]) == 0  # seeds disagree: the CI reaches past -1 pt and above it
    out = capsys.readouterr().out
    assert "90.0 → 89.2 (-0.8 pts, CI -9.6 … +8.0: inconclusive (more than 1000 seeds would be needed))" in out


def _stamped(records, **env):
    return [dataclasses.replace(r, env={**r.env, **env}) for r in records]


def test_environment_mismatch_warns_and_strict_env_refuses(tmp_path, capsys):
    here = dict(cpu="AMD EPYC", torch="2.13.0", torch_threads=2, git_commit="a" * 40)
    base = _write(tmp_path / "a.jsonl", _stamped(BASE, **here))
    same = _write(tmp_path / "b.jsonl", _stamped(BASE, **{**here, "git_commit": "b" * 40}))
    other = _write(tmp_path / "c.jsonl", _stamped(BASE, **{**here, "cpu": "Intel Xeon", "torch_threads": 8,
                                                           "torchao": "0.18.0"}))
    assert main(["compare", str(base), str(same), "--strict-env"]) == 0
    out = capsys.readouterr().out
    assert f"BASE commit {'a' * 12} → NEW commit {'b' * 12}" in out and "Warning" not in out
    assert main(["compare", str(base), str(other)]) == 0
    out = capsys.readouterr().out
    assert "different environments" in out and "cpu: AMD EPYC → Intel Xeon" in out and "torch_threads: 2 → 8" in out
    assert "torchao" not in out  # BASE does not stamp it at all: nothing to compare
    assert main(["compare", str(base), str(other), "--strict-env"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cpu: AMD EPYC → Intel Xeon" in err[0]


def test_a_library_missing_in_one_run_is_a_difference():
    without, with_it = _stamped(BASE, torchao=None), _stamped(BASE, torchao="0.18.0")
    assert environments.environment_differences(without, with_it) == ["torchao: None → 0.18.0"]


def test_peak_memory_floor_ignores_small_absolute_growth():
    metric = metrics.BY_COLUMN["train_mem_mib"]
    change = compare.Change(49.0)  # 15 -> 23 MiB: RSS noise of a tiny model in a shared process
    floor = compare.Thresholds(min_peak_growth_mib=32)
    assert compare.crossed(metric, change, compare.Thresholds(), growth=8.0) == "peak memory +49.0 % (limit 5 %)"
    assert compare.crossed(metric, change, floor, growth=8.0) is None
    assert compare.crossed(metric, change, floor, growth=40.0) == "peak memory +49.0 % (limit 5 %)"
    state = metrics.BY_COLUMN["state_mib"]
    assert compare.crossed(state, change, floor, growth=0.1) == "state +49.0 % (limit 5 %)"  # exact: no floor


def test_the_cpu_generation_and_kernel_set_are_compared():
    """Two VMs can both say "AMD EPYC": family/model and torch's kernel set still tell them apart."""
    zen3 = _stamped(BASE, cpu="AMD EPYC", cpu_model="family 25 model 1 stepping 1", cpu_capability="AVX2")
    zen4 = _stamped(BASE, cpu="AMD EPYC", cpu_model="family 25 model 17 stepping 1", cpu_capability="AVX512")
    assert environments.environment_differences(zen3, zen4) == [
        "cpu_model: family 25 model 1 stepping 1 → family 25 model 17 stepping 1", "cpu_capability: AVX2 → AVX512"]


def test_this_machine_stamps_its_cpu_generation_and_load():
    """The stamp against /proc/cpuinfo read here (the first processor's block): family, model and stepping where
    the file names them, None where it does not (off Linux, or an ARM cpuinfo without a family)."""
    import re
    from pathlib import Path

    from optbench.records.environment import environment

    env = environment()
    assert env["cpu_capability"] and isinstance(env["load_avg_1m"], float)
    cpuinfo = Path("/proc/cpuinfo")
    first = cpuinfo.read_text().split("\n\n")[0] if cpuinfo.exists() else ""
    fields = dict(re.findall(r"^(cpu family|model|stepping)\s*:\s*(.*)$", first, flags=re.MULTILINE))
    expected = (f"family {fields['cpu family']} model {fields.get('model', '?')} stepping {fields.get('stepping', '?')}"
                if "cpu family" in fields else None)
    assert env["cpu_model"] == expected


def test_the_cpu_generation_comes_from_family_model_and_stepping(monkeypatch):
    from optbench.records import environment

    monkeypatch.setattr(environment, "_cpuinfo", lambda: {"cpu family": "25", "model": "17", "stepping": "1",
                                                          "model name": "AMD EPYC"})
    assert environment.cpu_model() == "family 25 model 17 stepping 1"
    monkeypatch.setattr(environment, "_cpuinfo", lambda: {"model name": "Neoverse-N1", "CPU part": "0xd0c"})
    assert environment.cpu_model() is None  # no family to tell generations apart by


def test_a_run_timed_on_a_busy_machine_is_flagged_in_the_header(tmp_path, capsys):
    quiet = _write(tmp_path / "a.jsonl", _stamped(BASE, cpu_count=2, load_avg_1m=1.9))
    busy = _write(tmp_path / "b.jsonl", _stamped(BASE, cpu_count=2, load_avg_1m=16.5))
    assert main(["compare", str(quiet), str(quiet)]) == 0
    assert "busy machine" not in capsys.readouterr().out
    assert main(["compare", str(quiet), str(busy)]) == 0  # a warning, not a verdict
    assert "NEW was timed on a busy machine (1-minute load up to 16.5 on 2 cores" in capsys.readouterr().out


# --- the target metric of the `lm` workload: perplexity, lower is better, gated in % of BASE ---------------

LM_JOB = dict(model="llama-h256-l4", dataset="d", device="cpu", steps=10, batch_size=4, seq_len=8, workload="lm")


def _lm(seed, perplexity, optimizer="adamw"):
    return Record(trial_id=f"lm-{optimizer}-{seed}", optimizer=optimizer, seed=seed, status="ok",
                  state_precision="fp32", state_bytes=100 * MIB, peak_rss_growth_bytes=400 * MIB,
                  step_time_median_s=0.2, optimizer_step_median_s=0.05, target_metric="perplexity", target_mode="min",
                  eval_metrics={"perplexity": perplexity, "token_accuracy": 0.5}, **LM_JOB)


BASE_PPL = [3.50, 3.62, 3.55]


def test_a_perplexity_twenty_percent_worse_is_a_regression_naming_perplexity(tmp_path, capsys):
    base = _write(tmp_path / "base.jsonl", [_lm(s, p) for s, p in enumerate(BASE_PPL)])
    factors = [1.19, 1.21, 1.20]  # +20 % on average, seeds agreeing within a point
    worse = _write(tmp_path / "worse.jsonl", [_lm(s, p * f) for s, (p, f)
                                              in enumerate(zip(BASE_PPL, factors, strict=True))])
    assert main(["compare", str(base), str(worse)]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("- adamw ["))
    assert "eval perplexity +20.0 %, 95 % CI +17.5 … +22.5 % (limit +2 %)" in line
    assert "worse by at least 2 %" in out  # the table cell says it in the verdict words
    assert main(["compare", str(base), str(worse), "--max-metric-worsening", "25"]) == 0
    better = _write(tmp_path / "better.jsonl", [_lm(s, p * 0.8) for s, p in enumerate(BASE_PPL)])
    assert main(["compare", str(base), str(better)]) == 0


def test_perplexity_gate_directly_and_with_one_seed():
    base, new = [_lm(0, 3.5)], [_lm(0, 3.5 * 1.03)]  # one seed: the plain threshold on the relative change
    comparison = compare.compare(base, new, compare.Thresholds())
    assert comparison.regressions == [f"adamw [{LABEL.replace('m on d', 'llama-h256-l4 on d')}]: "
                                      "eval perplexity +3.0 % (limit +2 %)"]
    assert compare.compare(base, new, compare.Thresholds(max_metric_worsening_pct=5.0)).regressions == []
    # the accuracy threshold does not apply to perplexity, however strict
    strict = compare.Thresholds(max_accuracy_drop_pts=0.0, max_metric_worsening_pct=5.0)
    assert compare.compare(base, new, strict).regressions == []


def test_perplexity_is_exported_as_smaller_is_better(tmp_path):
    runs = [_lm(s, p) for s, p in enumerate(BASE_PPL)]
    comparison = compare.compare(runs, runs, compare.Thresholds())
    paths = compare_table.export_github_benchmark(comparison, tmp_path / "b.json")
    smaller, bigger = (json.loads(p.read_text()) for p in paths)
    ppl = next(e for e in smaller if "perplexity" in e["name"])
    assert ppl["value"] == pytest.approx(np.mean(BASE_PPL)) and ppl["unit"] == "perplexity"
    assert bigger == []
