"""Sweeps: subprocess isolation, timeout, resume, and a failing trial that does not stop the sweep."""

import sys

from optbench.plan import TrialSpec, build_grid
from optbench.results import Record, read_records
from optbench.runner import run_in_subprocess, run_sweep

TINY = dict(workload="tiny", device="cpu", steps=3, warmup_steps=1, batch_size=4, seq_len=16, eval_size=16)


def test_resume_skips_trials_already_ok(tmp_path):
    out = tmp_path / "r.jsonl"
    specs = build_grid(["adamw", "adafactor"], [0, 1], **TINY)
    ran = []

    def fake(spec):
        ran.append(spec.trial_id)
        status = "error" if (spec.optimizer, spec.seed) == ("adafactor", 1) else "ok"
        return Record(trial_id=spec.trial_id, optimizer=spec.optimizer, seed=spec.seed, status=status)

    run_sweep(specs, out, run_trial=fake)
    assert len(ran) == 4 and len(read_records(out)) == 4
    ran.clear()
    run_sweep(specs, out, run_trial=fake)
    assert ran == [specs[3].trial_id]  # only the failed trial runs again
    assert len(read_records(out)) == 5  # and nothing recorded before is lost


def test_a_failing_trial_does_not_stop_the_sweep(tmp_path):
    out = tmp_path / "r.jsonl"
    specs = [TrialSpec(optimizer="adamw", optimizer_kwargs={"betas": [2.0, 0.9]}, **TINY),
             TrialSpec(optimizer="adafactor", **TINY)]
    records = run_sweep(specs, out, run_id="r1")
    assert [r.status for r in records] == ["error", "ok"]
    assert all(r.run_id == "r1" for r in read_records(out))


def test_timeout_kills_the_trial_and_records_it():
    record = run_in_subprocess(TrialSpec(optimizer="adamw", timeout_s=0.5, **TINY))
    assert record.status == "timeout" and "0.5 s" in record.error
    assert record.optimizer == "adamw"


def test_hard_crash_of_the_child_is_an_error_record(tmp_path, monkeypatch):
    # A child that dies without writing its record (as on a segfault) is still recorded.
    monkeypatch.setattr(sys, "executable", "/bin/false")
    record = run_in_subprocess(TrialSpec(optimizer="adamw", **TINY))
    assert record.status == "error" and "exited with code 1" in record.error
