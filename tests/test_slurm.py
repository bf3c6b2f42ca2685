"""`--executor slurm` against a real one-node Slurm cluster (scripts/slurm-local): job arrays, one record per trial,
and the cluster's faults — scancel of one task, a requeued task, Ctrl-C / SIGTERM on the submit host, a rerun, a
refused submission, a task that never starts. Skipped where the cluster cannot start (not root, no apt).

The cluster is started here unless it already runs (.ci/run starts it first), and stopped again only if started
here; after every test no job is left in the queue, so no trial process outlives its test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from _tiny import TINY_ARGS, optbench, started

from optbench.records.record import read_records

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "slurm-local"
# Long enough to act on a running task (scancel, requeue, Ctrl-C) before it finishes: ~10-30 s on 2 busy cores.
LONG = ["--steps", "80"]


@pytest.fixture(scope="module", autouse=True)
def cluster():
    if os.geteuid() != 0:
        pytest.skip("the one-node Slurm cluster needs root (scripts/slurm-local installs and runs slurmd)")
    up = subprocess.run([SCRIPT, "status"], capture_output=True).returncode == 0
    if not up:
        start = subprocess.run([SCRIPT, "start"], capture_output=True, text=True, timeout=900)
        if start.returncode != 0:
            pytest.skip(f"no Slurm cluster here: {start.stderr.strip().splitlines()[-1:]}")
    conf = subprocess.run([SCRIPT, "env"], capture_output=True, text=True, check=True).stdout.split("=", 1)[1]
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf.strip()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        if not up:
            subprocess.run([SCRIPT, "stop"], capture_output=True, timeout=120)


def squeue(*args: str) -> dict[str, str]:
    """{task id: state} of every job the cluster lists (plain squeue: pending, running, completing)."""
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T", *args], capture_output=True, text=True, check=True)
    return dict(line.split() for line in out.stdout.splitlines())


@pytest.fixture(autouse=True)
def empty_queue():
    """Nothing a test submitted outlives it: every job left is cancelled, and gone, before the next test."""
    yield
    if left := squeue():
        subprocess.run(["scancel", *{task.split("_")[0] for task in left}], check=False)
    deadline = time.monotonic() + 60
    while squeue() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not squeue(), "jobs left in the queue"


def wait_for(condition, timeout_s: float = 300, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def running_tasks(count: int = 1) -> list[str]:
    return wait_for(lambda: sorted(t for t, s in squeue().items() if s == "RUNNING")[:count]
                    if sum(s == "RUNNING" for s in squeue().values()) >= count else None, what="running tasks")


def slurm_run(out: Path, *extra: str, optimizers: str = "adamw,adafactor") -> list[str]:
    return ["run", *TINY_ARGS, "--optimizers", optimizers, "--executor", "slurm", "--out", str(out), "--no-figures",
            *extra]


def by_trial(out: Path) -> dict[str, list]:
    records: dict[str, list] = {}
    for record in read_records(out):
        records.setdefault(record.trial_id, []).append(record)
    return records


@pytest.mark.slow
def test_run_smoke_as_typed_records_every_trial_ok(tmp_path):
    """The issue's command, as typed (device auto, on a CPU-only partition): one array, every trial ok, once."""
    out = tmp_path / "smoke.jsonl"
    done = optbench("run", "--preset", "smoke", "--optimizers", "adamw,adafactor", "--executor", "slurm",
                    "--out", out, "--no-figures", timeout=900)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.count("slurm job ") == 1 and "2 trial(s)" in done.stderr and "0 GPU(s)" in done.stderr
    records = by_trial(out)
    assert len(records) == 2 and all(len(r) == 1 and r[0].status == "ok" for r in records.values()), records
    assert all(r[0].slurm_job_id and r[0].device == "cpu" for r in records.values())
    logs = sorted(p.name for p in (tmp_path / "smoke" / "logs").iterdir())
    assert len(logs) == 2 and all(log.endswith(f"{tid}.log") for tid in records for log in logs if tid in log)


@pytest.fixture(scope="module")
def cancelled(tmp_path_factory):
    """Three trials, two at a time; one running task is scancelled. Returns (out, the run's stderr, its exit
    status, the cancelled task)."""
    out = tmp_path_factory.mktemp("cancel") / "r.jsonl"
    with started(slurm_run(out, *LONG, "--slurm-max-running", "2", optimizers="adamw,adafactor,sgd"),
                 stderr=subprocess.PIPE, text=True) as sweep:
        victim = running_tasks(1)[0]
        subprocess.run(["scancel", victim], check=True)
        _, err = sweep.communicate(timeout=600)
    return out, err, sweep.returncode, victim


def test_scancel_of_one_task_records_it_and_the_sweep_goes_on(cancelled):
    out, err, status, victim = cancelled
    assert status == 3, err  # a trial ended error: exit 3
    assert "Traceback" not in err
    records = by_trial(out)
    assert len(records) == 3 and all(len(r) == 1 for r in records.values())
    failed = [r[0] for r in records.values() if r[0].status != "ok"]
    assert len(failed) == 1 and failed[0].slurm_job_id == victim, failed
    assert failed[0].status == "error" and "cancelled" in failed[0].error


def test_a_rerun_resubmits_only_the_trials_not_ok(cancelled):
    out, _, _, victim = cancelled
    before = by_trial(out)
    again = optbench(*slurm_run(out, *LONG, "--slurm-max-running", "2", optimizers="adamw,adafactor,sgd"))
    assert again.returncode == 0, again.stderr
    arrays = [line for line in again.stderr.splitlines() if "slurm job " in line]
    assert len(arrays) == 1 and ": 1 trial(s) on" in arrays[0], again.stderr  # one array: the missing trial
    after = by_trial(out)
    ran = [tid for tid in after if len(after[tid]) > len(before[tid])]
    assert len(ran) == 1 and before[ran[0]][0].slurm_job_id == victim
    assert after[ran[0]][-1].status == "ok"


def test_a_requeued_task_runs_again_and_is_recorded_once(tmp_path):
    out = tmp_path / "r.jsonl"
    with started(slurm_run(out, *LONG), stderr=subprocess.PIPE, text=True) as sweep:
        task = running_tasks(1)[0]
        subprocess.run(["scontrol", "requeue", task], check=True)
        # Slurm holds a requeued job back for two minutes (BeginTime); let it start again now.
        subprocess.run(["scontrol", "update", f"JobId={task}", "StartTime=now"], check=True)
        _, err = sweep.communicate(timeout=600)
    assert sweep.returncode == 0, err
    records = by_trial(out)
    assert len(records) == 2 and all(len(r) == 1 and r[0].status == "ok" for r in records.values()), records
    requeued = [r[0] for r in records.values() if r[0].slurm_job_id == task]
    assert len(requeued) == 1 and requeued[0].slurm_restarts == 1
    assert len(out.read_text().splitlines()) == 2


@pytest.mark.parametrize("signum,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupting_the_submit_host_cancels_every_job(tmp_path, signum, status):
    out = tmp_path / "r.jsonl"
    with started(slurm_run(out, *LONG, "--slurm-max-running", "1", optimizers="adamw,adafactor,sgd"),
                 ignore_sigint=True, stderr=subprocess.PIPE, text=True) as sweep:
        running_tasks(1)
        array = next(iter(squeue())).split("_")[0]
        sweep.send_signal(signum)
        _, err = sweep.communicate(timeout=120)
    assert sweep.returncode == status, err
    assert "Traceback" not in err and f"cancelled slurm job(s) {array}: none left in the queue" in err
    assert not squeue("-j", array)


@pytest.mark.parametrize("flags,words", [
    (["--slurm-partition", "nosuch"], "invalid partition"),
    (["--gpus-per-trial", "1"], "generic resource"),  # a GPU asked of a CPU-only cluster
    (["--slurm-partition", "short"], "time limit"),  # 17 min asked of a partition whose MaxTime is 1 min
])
def test_a_refused_submission_is_one_line_and_a_record_per_trial(tmp_path, flags, words):
    out = tmp_path / "r.jsonl"
    done = optbench(*slurm_run(out, *flags))
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    refused = [line for line in done.stderr.splitlines() if "slurm refused" in line]
    assert len(refused) == 1 and words in refused[0].lower(), done.stderr
    records = read_records(out)
    assert len(records) == 2 and all(r.status == "error" and "refused" in r.error for r in records)


def test_a_task_that_never_starts_ends_timeout_with_the_reason(tmp_path):
    out = tmp_path / "r.jsonl"
    done = optbench(*slurm_run(out, "--slurm-partition", "maint", "--slurm-pending-timeout", "5",
                               optimizers="adamw"))
    assert done.returncode == 3, done.stderr
    [record] = read_records(out)
    assert record.status == "timeout" and "PartitionDown" in record.error and "never started" in record.error
    assert not squeue()


def test_concurrent_array_tasks_land_in_the_one_file_once(tmp_path):
    """Four tasks at once (two CPUs, two running) writing their records into one results file themselves."""
    out = tmp_path / "r.jsonl"
    done = optbench(*slurm_run(out, "--seeds", "0,1", optimizers="adamw,adafactor"))
    assert done.returncode == 0, done.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == 4 and len({json.loads(line)["trial_id"] for line in lines}) == 4
