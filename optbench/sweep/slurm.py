"""`--executor slurm`: each round of trials as one Slurm job array, submitted with submitit, watched with squeue.

A round (the trials of a `run`, a study's walk step or its finals) is one `sbatch --array` (submitit's batch
submission), `--slurm-max-running` its concurrency cap. Each task runs one trial on its node (slurm_node.py), which
stores the record itself; the sweep watches the tasks with squeue (slurm_queue.py) and settles each one exactly
once: the node's record, or — for a task the scheduler refused, cancelled, timed out or never started — a record
with that status and the scheduler's reason. Nothing here raises out of a cluster fault: a refused submission is
one line on stderr and a record per trial. `stop()` (Ctrl-C, SIGTERM on the submit host) cancels every array still
in the queue and waits until squeue no longer lists them.

What the user sees: a line per submitted array (job id, GPUs, time limit, cap, where the logs go) and a line
whenever the scheduler's counts change (`3 queued, 2 running, 5 done of 10`).
"""

from __future__ import annotations

import contextlib
import io
import math
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from optbench.job.spec import TrialSpec
from optbench.records.environment import names_cuda
from optbench.records.record import Record, read_records
from optbench.sweep import slurm_queue
from optbench.sweep.executors import cause_in_log, failed_record, trial_log_name
from optbench.sweep.slurm_node import NodeTask, run_on_node
from optbench.sweep.slurm_queue import SchedulerError, TaskState

PENDING_TIMEOUT_S = 1800.0  # a task stuck (slurm_queue.STUCK_REASONS) this long is cancelled and recorded `timeout`
NODE_SLACK_S = 120.0  # on top of a trial's time: the node's start (imports) and its record after the trial's timeout
PREDICTION_MARGIN = 2.0  # a recorded trial's wall time x this: a slower node, a busier file system
TICK_S = 1.0  # how often finished tasks' result files are looked for (a file-system stat per task)
POLL_MIN_S, POLL_MAX_S = 2.0, 30.0  # squeue: every 2 s at first, then every tenth of the round's age, up to 30 s
RESULT_GRACE_S = 30.0  # how long an ended state must last before it settles a task with no result file:
SETTLING = ("COMPLETED", "PREEMPTED")  # the file may reach this host late (NFS); a preempted task may be requeued
LISTING_GRACE_S = 30.0  # a task squeue does not list (not yet, or no longer: MinJobAge) before it counts as lost
STOP_WAIT_S = 60.0  # after scancel: how long to wait for the queue to let go of our jobs
WARN_EVERY_S = 60.0  # a scheduler command that keeps failing is reported at most this often


@dataclass(frozen=True)
class SlurmOptions:
    """The `--slurm-*` flags and `--gpus-per-trial`: where the arrays run and what each task asks for."""

    partition: str | None = None  # None: the cluster's default partition
    time_min: int | None = None  # None: derived (time_limit_min)
    gpus_per_trial: int | None = None  # None: from the device, and for `auto` from the partition's GPUs
    gpu_type: str | None = None  # `--gpus-per-trial a100:1`
    account: str | None = None
    max_running: int | None = None  # the array's %N; None: every task at once
    sbatch_options: dict[str, str | bool] = field(default_factory=dict)  # `--slurm-option KEY=VALUE`
    pending_timeout_s: float = PENDING_TIMEOUT_S


def gpus_for(spec: TrialSpec, asked: int | None, partition_gpus: int | None) -> int:
    """GPUs one task asks for: `--gpus-per-trial` when given; none for `--device cpu`; a torchrun group's ranks for
    `cuda`; and for `auto` the same only where the partition has GPUs (a CPU partition refuses any GPU request)."""
    if asked is not None:
        return asked
    if spec.device == "cpu":
        return 0
    if names_cuda(spec.device) or partition_gpus:
        return max(1, spec.nproc)
    return 0


def _same_job(spec: TrialSpec, record: Record, gpus: int) -> bool:
    """A recorded trial that predicts this one's time: same optimizer, job, ranks, threads and kind of device.

    The job is every record.JOB_KEY_FIELDS field a spec has (world_size as its nproc; its model and dataset None:
    the workload's own); a spec's --threads, where set, must be the count the record's trial ran with."""
    return (record.optimizer == spec.optimizer and record.workload == spec.workload
            and record.workload_options == spec.workload_options and spec.model in (None, record.model)
            and spec.dataset in (None, record.dataset) and record.steps == spec.steps
            and record.warmup_steps == spec.warmup_steps and record.schedule == spec.schedule
            and record.batch_size == spec.batch_size and record.seq_len == spec.seq_len
            and record.eval_size == spec.eval_size and record.precision == spec.precision
            and record.engine == spec.engine and record.parallel == spec.parallel
            and record.world_size == spec.nproc and spec.threads in (None, record.env.get("torch_threads"))
            and record.fidelity == spec.fidelity and record.resume_check == spec.resume_check
            and (record.stage is None) == (spec.stage is None)
            and names_cuda(record.device) == bool(gpus))


def cpus_per_task(specs: Sequence[TrialSpec]) -> int:
    """CPUs one task of the array asks for: each rank of its torchrun group its --threads (one where unset), so
    that a trial's threads never contend for fewer CPUs than it runs; the node then shares them out
    (slurm_node.node_environment)."""
    return max(spec.nproc * (spec.threads or 1) for spec in specs)


def time_limit_min(specs: Sequence[TrialSpec], history: Sequence[Record], gpus: int) -> int:
    """The array's time limit in minutes: the longest of its trials' predicted times plus NODE_SLACK_S.

    A trial's predicted time is PREDICTION_MARGIN x the longest wall time of the same job already recorded ok in
    the results file (a study's tune trials predict its finals), never more than the trial's own timeout; with
    nothing recorded, the timeout itself (--timeout, or the preset's). A shorter limit starts sooner on a busy
    cluster (backfill); a trial that overruns it ends `timeout`, as it would at its own timeout."""
    def limit_s(spec: TrialSpec) -> float:
        walls = [r.wall_s for r in history if r.status == "ok" and r.wall_s and _same_job(spec, r, gpus)]
        predicted = PREDICTION_MARGIN * max(walls) if walls else spec.timeout_s
        return min(predicted, spec.timeout_s) + NODE_SLACK_S

    return max(1, math.ceil(max(limit_s(spec) for spec in specs) / 60))


@dataclass
class _Task:
    """One submitted trial and what the sweep has seen of it."""

    spec: TrialSpec
    job: Any  # submitit's SlurmJob: its id, its folder's files, scancel
    log_path: Path
    state: TaskState | None = None
    unlisted_since: float | None = None
    ended_since: float | None = None
    stuck_since: float | None = None

    @property
    def job_id(self) -> str:
        return self.job.job_id


class SlurmExecutor:
    """An ArrayExecutor (executors.py) for Slurm; `folder` holds submitit's files (scripts, pickles, node logs)
    and must be on storage the nodes share, like the results file."""

    def __init__(self, folder: Path, options: SlurmOptions, stream: TextIO | None = sys.stderr):
        import submitit

        self.folder, self.options, self.stream = folder.resolve(), options, stream
        submitit.SlurmExecutor(folder=self.folder)  # RuntimeError where there is no srun: no Slurm here
        self._arrays: set[str] = set()  # submitted arrays that may still be queued or running
        self._warned_at = -math.inf

    def _say(self, line: str) -> None:
        if self.stream is not None:
            print(f"optbench: {line}", file=self.stream, flush=True)

    def run_all(self, specs: list[TrialSpec], run_id: str, out_path: Path) -> Iterator[Record]:
        """Submit `specs` (one array per GPU request, so normally one), then yield each trial's record as it
        settles."""
        out_path = out_path.resolve()
        history = _read_history(out_path)
        groups: dict[int, list[TrialSpec]] = {}
        partition_gpus = self._partition_gpus(specs)
        for spec in specs:
            groups.setdefault(gpus_for(spec, self.options.gpus_per_trial, partition_gpus), []).append(spec)
        tasks: list[_Task] = []
        for gpus, group in groups.items():
            submitted = self._submit(group, gpus, run_id, out_path, history)
            if isinstance(submitted, str):
                self._say(f"slurm refused the array of {len(group)} trial(s): {submitted}")
                yield from (failed_record(spec, "error", f"slurm refused the submission: {submitted}")
                            for spec in group)
            else:
                tasks += submitted
        yield from self._watch(tasks)

    def _partition_gpus(self, specs: Sequence[TrialSpec]) -> int | None:
        """The partition's GPUs per node, asked only when a trial's device is `auto` and no count was given."""
        if self.options.gpus_per_trial is not None or all(spec.device != "auto" for spec in specs):
            return None
        try:
            return slurm_queue.partition_gpus(self.options.partition)
        except SchedulerError as exc:
            self._say(f"warning: cannot read the partition's GPUs ({exc}); asking for none")
            return None

    def _parameters(self, specs: Sequence[TrialSpec], gpus: int, history: Sequence[Record]) -> dict[str, Any]:
        """submitit's parameters for one array: time limit, cap, partition, account, GPUs, extra sbatch options."""
        options = self.options
        parameters: dict[str, Any] = {
            "job_name": "optbench", "time": options.time_min or time_limit_min(specs, history, gpus),
            "array_parallelism": options.max_running or len(specs), "stderr_to_stdout": True,
            "additional_parameters": dict(options.sbatch_options)}
        cpus = cpus_per_task(specs)
        if cpus > 1 and "cpus-per-task" not in options.sbatch_options:
            parameters["cpus_per_task"] = cpus
        for key, value in (("partition", options.partition), ("account", options.account)):
            if value:
                parameters[key] = value
        if gpus:
            parameters["gpus_per_node"] = f"{options.gpu_type}:{gpus}" if options.gpu_type else gpus
        return parameters

    def _submit(self, specs: list[TrialSpec], gpus: int, run_id: str, out_path: Path,
                history: Sequence[Record]) -> list[_Task] | str:
        """One sbatch array for `specs`; the scheduler's complaint (one line) when it refuses it."""
        import submitit
        from submitit.core.utils import FailedJobError, FailedSubmissionError

        parameters = self._parameters(specs, gpus, history)
        executor = submitit.SlurmExecutor(folder=self.folder, max_num_timeout=0)  # fresh: no earlier round's GPUs
        executor.update_parameters(**parameters)
        log_dir = out_path.with_suffix("") / "logs"
        try:  # submitit prints a refusal's stderr as well as raising it: the one line below says it
            with contextlib.redirect_stderr(io.StringIO()), executor.batch():
                jobs = [executor.submit(run_on_node, NodeTask(spec.to_dict(), run_id, str(out_path), str(log_dir),
                                                              gpus)) for spec in specs]
        except (FailedJobError, FailedSubmissionError, OSError) as exc:
            return slurm_queue.complaint(str(exc))
        for job in jobs:  # a cluster whose job ids started again (a test cluster's fresh state) must not find old ones
            job.paths.result_pickle.unlink(missing_ok=True)
        array = jobs[0].job_id.split("_")[0]
        self._arrays.add(array)
        where = f"partition {self.options.partition}" if self.options.partition else "the default partition"
        self._say(f"slurm job {array}: {len(specs)} trial(s) on {where}, {gpus} GPU(s) and {parameters['time']} min "
                  f"each, at most {min(len(specs), parameters['array_parallelism'])} at once; trial logs in {log_dir}")
        return [_Task(spec, job, log_dir / trial_log_name(spec)) for spec, job in zip(specs, jobs, strict=True)]

    def _watch(self, tasks: list[_Task]) -> Iterator[Record]:
        """Yield each task's record once it settles: from its result file, or from the scheduler's state."""
        waiting = {task.job_id: task for task in tasks}
        counts: tuple[int, int, int] | None = None
        started, next_poll = time.monotonic(), 0.0
        while waiting:
            for task in [task for task in waiting.values() if task.job.paths.result_pickle.exists()]:
                del waiting[task.job_id]
                yield self._returned(task)
            now = time.monotonic()
            if waiting and now >= next_poll:
                next_poll = now + min(POLL_MAX_S, max(POLL_MIN_S, (now - started) / 10))
                for task in self._settled(waiting):
                    del waiting[task.job_id]
                    yield self._record_from_state(task)
                shown = self._counts(tasks, waiting)
                if shown != counts:
                    counts = shown
                    arrays = ",".join(sorted({task.job_id.split("_")[0] for task in tasks}))
                    self._say(f"slurm {arrays}: {shown[0]} queued, {shown[1]} running, {shown[2]} done "
                              f"of {len(tasks)}")
            if waiting:
                time.sleep(TICK_S)
        self._arrays -= {task.job_id.split("_")[0] for task in tasks}

    @staticmethod
    def _counts(tasks: list[_Task], waiting: dict[str, _Task]) -> tuple[int, int, int]:
        queued = sum(1 for task in waiting.values() if task.state is None or task.state.waiting)
        return queued, len(waiting) - queued, len(tasks) - len(waiting)

    def _settled(self, waiting: dict[str, _Task]) -> list[_Task]:
        """Read the scheduler's states; the tasks that ended without a result file, or were stuck too long."""
        try:
            states = slurm_queue.task_states({job_id.split("_")[0] for job_id in waiting})  # whole arrays
        except SchedulerError as exc:
            if time.monotonic() - self._warned_at >= WARN_EVERY_S:  # a controller down for a while: not every poll
                self._warned_at = time.monotonic()
                self._say(f"warning: {exc}; asking again")
            return []
        now = time.monotonic()
        settled = []
        for task in waiting.values():
            state = states.get(task.job_id)
            if state is None:
                task.unlisted_since = task.unlisted_since or now
                if now - task.unlisted_since >= LISTING_GRACE_S:
                    settled.append(task)
                continue
            task.state, task.unlisted_since = state, None
            if state.ended:
                task.ended_since = task.ended_since or now
                if state.state not in SETTLING or now - task.ended_since >= RESULT_GRACE_S:
                    settled.append(task)
            elif self._stuck_too_long(task, now):
                settled.append(task)
        return settled

    def _stuck_too_long(self, task: _Task, now: float) -> bool:
        """Pending on a reason waiting does not clear, for --slurm-pending-timeout: cancel it (it may yet start)."""
        if task.state is None or not task.state.stuck:
            task.stuck_since = None
            return False
        limit = self.options.pending_timeout_s
        if task.stuck_since is None:
            task.stuck_since = now
            self._say(f"slurm {task.job_id} ({task.spec.optimizer} seed {task.spec.seed}) is pending: "
                      f"{task.state.reason}; cancelled in {limit:g} s unless it starts (--slurm-pending-timeout)")
        if now - task.stuck_since < limit:
            return False
        try:
            slurm_queue.cancel([task.job_id])
        except SchedulerError as exc:
            self._say(f"warning: {exc}")
        return True

    def _returned(self, task: _Task) -> Record:
        """A task whose function returned (the node stored its record) or raised (an error record here)."""
        from submitit.core.utils import pickle_load

        outcome, value = pickle_load(task.job.paths.result_pickle)
        if outcome == "success" and isinstance(value, dict):
            return Record.from_dict(value)
        last = str(value).strip().splitlines()[-1:] or ["no traceback"]
        return self._failed(task, "error", f"the job raised {last[0]}")

    def _record_from_state(self, task: _Task) -> Record:
        state = task.state
        if state is None or task.unlisted_since is not None:
            return self._failed(task, "error", "the scheduler no longer lists the job, and it left no record")
        if state.stuck:
            waited = time.monotonic() - (task.stuck_since or time.monotonic())
            return self._failed(task, "timeout", f"never started: pending {waited:.0f} s on {state.reason} "
                                                 "(--slurm-pending-timeout), cancelled")
        status, words = slurm_queue.ended_status(state)
        if state.state in ("FAILED", "COMPLETED"):  # its own log says why
            words += f": {cause_in_log(task.job.paths.stdout)}"
        return self._failed(task, status, words)

    def _failed(self, task: _Task, status: str, words: str) -> Record:
        record = failed_record(task.spec, status, f"slurm {task.job_id}: {words} (log: {task.log_path})")
        record.slurm_job_id = task.job_id
        return record

    def stop(self) -> None:
        """Cancel every array still queued or running, and wait until squeue lets go of them."""
        arrays, self._arrays = sorted(self._arrays), set()
        if not arrays:
            return
        try:
            slurm_queue.cancel(arrays)
            deadline = time.monotonic() + STOP_WAIT_S
            while (left := slurm_queue.still_queued(arrays)) and time.monotonic() < deadline:
                time.sleep(0.5)
        except SchedulerError as exc:
            self._say(f"cancelling slurm job(s) {', '.join(arrays)} failed: {exc}; scancel them by hand")
            return
        note = f"{len(left)} task(s) still stopping" if left else "none left in the queue"
        self._say(f"cancelled slurm job(s) {', '.join(arrays)}: {note}")


def _read_history(out_path: Path) -> list[Record]:
    """The records already in the results file (time predictions); none when it is new or unreadable."""
    import warnings

    from optbench.records.record import ResultsFileError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return read_records(out_path) if out_path.is_file() else []
    except ResultsFileError:
        return []
