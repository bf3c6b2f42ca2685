"""Sweeps: subprocess isolation, timeout, resume, a failing trial that does not stop the sweep, --jobs,
executors, start-up timing and progress lines."""

import io
import multiprocessing.context
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import MutableMapping
from pathlib import Path

import pytest
from _tiny import TINY

from optbench.job import devices
from optbench.job.spec import TrialSpec, build_grid
from optbench.records.record import Record, read_records
from optbench.sweep import LocalExecutor, run_sweep, runner
from optbench.sweep.runner import slot_count


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


def run_in_subprocess(spec: TrialSpec) -> Record:
    """One trial in a fresh interpreter (no forkserver): a timeout or crash becomes a record with that status."""
    return LocalExecutor(startup="spawn").run(spec, {})


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


def test_threads_sets_each_trials_torch_threads_and_makes_it_another_trial(tmp_path):
    # --threads 1 on a machine whose torch runs two: the trial runs (and its stamp says) one; its id is not the
    # default trial's, so a results file of two-thread trials never resumes it as done, while the default's id is
    # unchanged (older results still resume)
    spec = TrialSpec(optimizer="adamw", **TINY, threads=1)
    assert spec.trial_id != TrialSpec(optimizer="adamw", **TINY).trial_id
    assert TrialSpec(optimizer="adamw", **TINY).trial_id == "b2bd40c17d8efd31"  # the id before --threads existed
    records = run_sweep([spec], tmp_path / "r.jsonl")
    assert records[0].status == "ok", records[0].error
    assert records[0].env["torch_threads"] == 1


def test_slots_are_the_jobs_on_cpu_and_the_gpus_on_cuda(monkeypatch):
    cpu = [TrialSpec(optimizer="adamw", **TINY)]
    cuda = [TrialSpec(optimizer="adamw", **{**TINY, "device": "auto"})]
    assert slot_count(cpu, 3, ["0", "1"]) == 3
    assert slot_count(cuda, 4, ["0", "1"]) == 2
    assert slot_count([TrialSpec(optimizer="adamw", parallel="ddp", nproc=2, **{**TINY, "device": "cuda"})], 4,
                      ["0", "1"]) == 1
    assert slot_count(cuda, 4, []) == 4  # auto without a GPU: CPU trials, the jobs asked for


def test_progress_is_one_plain_line_per_trial_with_eta(tmp_path):
    stream = io.StringIO()
    specs = build_grid(["adamw", "adafactor"], [0], **TINY)
    run_sweep(specs, tmp_path / "r.jsonl", progress=stream,
              run_trial=lambda s: Record(trial_id=s.trial_id, optimizer=s.optimizer, status="ok", wall_s=1.0))
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue() and len(lines) == 2
    assert lines[0].startswith("optbench: [1/2] adamw seed=0 ok in 1s; ETA ")
    assert lines[1].startswith("optbench: [2/2] adafactor") and lines[1].endswith("done")


def test_a_score_at_chance_reads_untrained_in_the_running_lines_as_in_the_table():
    """The running lines printed "accuracy 0.125" for a trial the table after them called untrained."""
    from optbench.cli.sweeping import summary_line
    from optbench.sweep.progress import Progress

    def trial(accuracy):
        return Record(trial_id="t", optimizer="sgd", seed=0, status="ok", wall_s=1.0, eval_metrics={
            "accuracy": accuracy}, target_metric="accuracy", target_mode="max", metric_chance=0.47, state_bytes=0)

    lines = []
    Progress(2, lines.append)(trial(0.48))
    Progress(2, lines.append)(trial(0.80))
    assert "(eval untrained)" in lines[0] and "(eval 0.8)" in lines[1]
    assert "accuracy untrained [1 s]" in summary_line(trial(0.48))
    assert "accuracy 0.8 [1 s]" in summary_line(trial(0.80))


def test_the_running_line_gives_train_mem_by_the_reports_rule():
    """Under ddp the gradients sit in the RSS baseline (DDP's buckets): the line adds them back, as the table does."""
    from optbench.cli.sweeping import summary_line

    record = Record(trial_id="t", optimizer="adamw", seed=0, status="ok", wall_s=1.0, parallel="ddp",
                    grads_bytes=100 * 2**20, peak_rss_growth_bytes=300 * 2**20, state_bytes=0, target_metric="accuracy")
    assert "train mem 400 MiB" in summary_line(record)


def test_the_running_line_gives_the_resume_checks_outcome():
    """--resume-check's outcome was in report.md only: the user watching the sweep saw none of it."""
    from optbench.cli.sweeping import summary_line

    def trial(**resume):
        return Record(trial_id="t", optimizer="adamw", seed=0, status="ok", wall_s=1.0, state_bytes=0,
                      target_metric="accuracy", **resume)

    assert "resume" not in summary_line(trial())
    assert summary_line(trial(resume_status="exact", resume_max_abs_param_diff=0.0)).endswith(", resume exact [1 s]")
    assert ", resume diverged (max Δparam 0.031) [1 s]" in summary_line(
        trial(resume_status="diverged", resume_max_abs_param_diff=0.0312))


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


class WatchedEnviron(MutableMapping):
    """os.environ as the sweep sees it, every write recorded; a deletion lingers, as a restore after clear() would,
    so that a thread reading meanwhile could find the variable gone."""

    def __init__(self, real) -> None:
        self.real, self.writes = real, []

    def __getitem__(self, key):
        return self.real[key]

    def __setitem__(self, key, value):
        self.writes.append(("set", key))
        self.real[key] = value

    def __delitem__(self, key):
        self.writes.append(("del", key))
        del self.real[key]
        time.sleep(0.01)

    def __iter__(self):
        return iter(dict(self.real))

    def __len__(self):
        return len(self.real)

    def copy(self):
        return dict(self.real)


class CapturedProcess:
    """A forkserver child that only says what it was given: its environment is the last argument."""

    launched: list[dict[str, str]] = []

    def __init__(self, target=None, args=(), daemon=None):
        self.args, self.pid, self.exitcode = args, None, None

    def start(self):
        CapturedProcess.launched.append(self.args[-1])

    def join(self, timeout=None):
        self.exitcode = 0  # exited without a record: the sweep records an error and goes on


def test_jobs_2_children_get_the_users_environment_and_their_own_gpu_and_the_sweeps_stays_as_it_was(tmp_path,
                                                                                               monkeypatch):
    """Two trials at once on a masked 3-GPU machine, the forkserver started by the first: each child is handed its
    whole environment, which is the user's plus its slot's one GPU from the user's mask; the sweep process's
    os.environ is never written (a thread handing out GPUs reads it), and counting GPUs writes nothing either."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b,GPU-c")
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    monkeypatch.setattr(runner, "cuda_device_count", lambda: 3)
    monkeypatch.setattr(multiprocessing.context.ForkServerContext, "Process", CapturedProcess)
    CapturedProcess.launched = []
    user = dict(os.environ)
    watched = WatchedEnviron(os.environ)
    monkeypatch.setattr(os, "environ", watched)
    specs = [TrialSpec(optimizer="adamw", **{**TINY, "device": "cuda", "seed": seed}) for seed in (0, 1)]
    records = run_sweep(specs, tmp_path / "r.jsonl", jobs=2, executor=LocalExecutor(echo=False), progress=None)
    devices.cuda_device_count()
    assert watched.writes == [] and dict(watched.real) == user
    assert [r.status for r in records] == ["error", "error"]  # the captured children wrote no record
    masks = sorted(env["CUDA_VISIBLE_DEVICES"] for env in CapturedProcess.launched)
    assert masks == ["GPU-a", "GPU-b"]  # one GPU each, from the user's mask, never the same one
    for env in CapturedProcess.launched:
        slot = {"CUDA_VISIBLE_DEVICES": env["CUDA_VISIBLE_DEVICES"], devices.GPU_PINNED_ENV: "1"}
        assert env == {**user, "TOKENIZERS_PARALLELISM": "false", "OPTBENCH_SWEEP_PID": str(os.getpid()), **slot}


def test_a_trial_that_cannot_run_is_recorded_skipped_by_the_sweep_with_its_run_id_and_without_torch(tmp_path):
    """A record of a trial that never ran (skipped here, timed out) holds its settings only: the sweep writes it
    without importing the training stack, and with the sweep's run id like every other record."""
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from optbench.job.spec import TrialSpec
        from optbench.sweep import failed_record, run_sweep
        spec = TrialSpec(optimizer="adamw8bit", workload="tiny", device="cpu")
        run_sweep([], Path({str(tmp_path / "r.jsonl")!r}), run_id="r1", skipped=[(spec, "needs bitsandbytes")])
        failed_record(TrialSpec(optimizer="adamw", workload="tiny", device="cpu"), "timeout", "too slow", 3.0)
        print(*[name for name in ("torch", "datasets", "transformers") if name in sys.modules])
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == ""  # none of them imported
    [record] = read_records(tmp_path / "r.jsonl")
    assert (record.status, record.run_id, record.error) == ("skipped", "r1", "unavailable here: needs bitsandbytes")
    assert record.model == "tiny-bert-h64" and record.device == "cpu" and record.job_key["model"] == "tiny-bert-h64"


def test_skipped_records_come_first_and_share_the_sweeps_run_id(tmp_path):
    specs = build_grid(["adamw"], [0, 1], **TINY)
    skipped = [(TrialSpec(optimizer="adamw8bit", **TINY), "needs bitsandbytes")]
    records = run_sweep(specs, tmp_path / "r.jsonl", run_id="r2", skipped=skipped, progress=None,
                        run_trial=lambda s: Record(trial_id=s.trial_id, optimizer=s.optimizer, status="ok"))
    assert [r.status for r in records] == ["skipped", "ok", "ok"]
    assert [r.run_id for r in read_records(tmp_path / "r.jsonl")] == ["r2"] * 3


def test_a_warning_the_trials_probes_raised_is_printed_once_per_sweep(tmp_path):
    stream = io.StringIO()
    said = ["the peak RSS could not be reset (...)", "the CPU's cache sizes could not be read (...)"]
    run_sweep(build_grid(["adamw", "adafactor"], [0], **TINY), tmp_path / "r.jsonl", progress=stream,
              run_trial=lambda s: Record(trial_id=s.trial_id, optimizer=s.optimizer, status="ok",
                                         measurement_warnings=said))
    lines = stream.getvalue().splitlines()
    assert [line for line in lines if "warning" in line] == [f"optbench: warning: {text}" for text in said]


@pytest.mark.parametrize(("threads", "jobs", "warned"), [(None, 1, False), (1, 1, False), ("cores + 1", 1, True),
                                                        (1, "cores + 1", True)])
def test_more_threads_than_cores_on_cpu_is_said_before_the_sweep(threads, jobs, warned, tmp_path, capsys):
    # --threads x --jobs past the cores this process may use: the step times are contention, and the user is told
    from argparse import Namespace

    from optbench.cli.sweeping import SLURM_FLAGS, executor

    over = len(os.sched_getaffinity(0)) + 1
    threads, jobs = (over if value == "cores + 1" else value for value in (threads, jobs))
    args = Namespace(executor="local", threads=threads, **{dest: None for _, dest in SLURM_FLAGS})
    executor(args, [TrialSpec(optimizer="adamw", **TINY)], tmp_path / "r.jsonl", jobs)
    said = capsys.readouterr().err
    assert ("is more than the" in said and "cores this process may use" in said) is warned, said
