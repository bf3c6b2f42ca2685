"""Sweeps: subprocess isolation, timeout, resume, a failing trial that does not stop the sweep, --jobs,
executors, start-up timing and progress lines."""

import io
import os
import subprocess
import sys

import pytest
from _tiny import TINY

from optbench.job.spec import TrialSpec, build_grid
from optbench.records.record import Record, read_records
from optbench.sweep import LocalExecutor, run_sweep
from optbench.sweep.runner import run_in_subprocess, slot_count


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


def test_jobs_2_runs_trials_at_once_and_records_each_once(tmp_path):
    out = tmp_path / "r.jsonl"
    specs = build_grid(["adamw", "adafactor"], [0, 1], **TINY)
    records = run_sweep(specs, out, jobs=2)
    assert all(r.status == "ok" for r in records), [r.error for r in records]
    ids = [r.trial_id for r in read_records(out)]
    assert sorted(ids) == sorted(s.trial_id for s in specs)  # each present, once
    # children ran with the CPU threads divided between the two slots
    assert {r.env["torch_threads"] for r in records} == {max(1, (os.cpu_count() or 1) // 2)}


def test_slots_are_the_jobs_on_cpu_and_the_gpus_on_cuda(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cpu = [TrialSpec(optimizer="adamw", **TINY)]
    cuda = [TrialSpec(optimizer="adamw", **{**TINY, "device": "auto"})]
    assert slot_count(cpu, 3, gpus=2) == 3
    assert slot_count(cuda, 4, gpus=2) == 2
    assert slot_count([TrialSpec(optimizer="adamw", parallel="ddp", nproc=2, **{**TINY, "device": "cuda"})], 4,
                      gpus=2) == 1


def test_progress_is_one_plain_line_per_trial_with_eta(tmp_path):
    stream = io.StringIO()
    specs = build_grid(["adamw", "adafactor"], [0], **TINY)
    run_sweep(specs, tmp_path / "r.jsonl", progress=stream,
              run_trial=lambda s: Record(trial_id=s.trial_id, optimizer=s.optimizer, status="ok", wall_s=1.0))
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue() and len(lines) == 2
    assert lines[0].startswith("optbench: [1/2] adamw seed=0 ok in 1s; ETA ")
    assert lines[1].startswith("optbench: [2/2] adafactor") and lines[1].endswith("done")


@pytest.mark.parametrize("startup", ["forkserver", "spawn"])
def test_start_up_is_measured_per_trial(startup):
    record = LocalExecutor(startup=startup, echo=False).run(TrialSpec(optimizer="adamw", **TINY), {})
    assert record.status == "ok", record.error
    assert record.startup_s > 0


def test_parallel_trials_launch_through_torchrun(tmp_path, monkeypatch):
    launched = []

    class FakePopen(subprocess.Popen):
        """Fakes only the torchrun launch; git and platform look-ups of the failed record run for real."""

        def __init__(self, command, **kwargs):
            self.fake = "torch.distributed.run" in command
            if not self.fake:
                super().__init__(command, **kwargs)
                return
            launched.append(command)
            self.pid = os.getpid()

        def wait(self, timeout=None):
            return 1 if self.fake else super().wait(timeout)

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    record = LocalExecutor(echo=False).run(TrialSpec(optimizer="adamw", parallel="ddp", nproc=2, **TINY), {})
    assert launched[0][1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                               "-m", "optbench.sweep.child", "rank", launched[0][-2], launched[0][-1]]
    assert record.status == "error" and "exited with code 1" in record.error
