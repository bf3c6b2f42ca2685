"""Run a sweep: up to `jobs` trials at once, each in its own fresh process, every record appended as it lands.

A fresh process per trial keeps peak-memory readings comparable (nothing left over from the previous
optimizer) and contains crashes: a segfault, an OOM kill or a hang becomes a record with a status
(executors.py). Trials already recorded `ok` in the output file are skipped, so re-running a killed
sweep resumes it. Records are appended one at a time under a file lock, so concurrent trials, or two
sweeps sharing a file, never tear or interleave a line.
"""

from __future__ import annotations

import os
import queue
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TextIO

from optbench.executors import Executor, FunctionExecutor, LocalExecutor
from optbench.plan import TrialSpec
from optbench.results import Record, append_record, completed_trial_ids


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep: running children were stopped; `recorded` trials made it to the file."""

    def __init__(self, recorded: int):
        super().__init__(recorded)
        self.recorded = recorded


class ResultsWriteError(OSError):
    """A record could not be appended (disk full, file gone read-only): the sweep stops, nothing is torn."""


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]


def run_in_subprocess(spec: TrialSpec) -> Record:
    """Run one trial in a fresh interpreter (no forkserver); a timeout or crash becomes a record with that status."""
    return LocalExecutor(startup="spawn").run(spec, {})


def cuda_device_count() -> int:
    """GPUs this process could use, counted without initialising CUDA (children must be free to pick theirs)."""
    if "torch" not in sys.modules:
        return 0  # nothing imported torch: the caller is not planning a CUDA run
    import torch

    return torch.cuda.device_count()


def child_environments(specs: list[TrialSpec], jobs: int, cpu_count: int | None = None,
                       gpu_count: int | None = None) -> list[dict[str, str]]:
    """One environment per concurrent slot: a GPU each on CUDA, an equal share of the CPU threads otherwise.

    A spec naming a device index (`cuda:1`) keeps it; `auto`/`cuda` specs see only their slot's GPU.
    """
    gpus = cuda_device_count() if gpu_count is None else gpu_count
    wants_cuda = gpus > 0 and any(s.device in ("auto", "cuda") for s in specs)
    if wants_cuda:
        return [{"CUDA_VISIBLE_DEVICES": str(slot)} for slot in range(min(jobs, gpus))]
    if jobs == 1:
        return [{}]
    threads = str(max(1, (cpu_count or os.cpu_count() or 1) // jobs))
    return [{"OPTBENCH_TORCH_THREADS": threads, "OMP_NUM_THREADS": threads} for _ in range(jobs)]


class _Progress:
    """One plain line per finished trial, `[i/N] ... ETA`: readable in a log file, no carriage returns."""

    def __init__(self, total: int, stream: TextIO | None):
        self.total, self.stream, self.done, self.started = total, stream, 0, time.perf_counter()

    def finished(self, record: Record) -> None:
        self.done += 1
        if self.stream is None:
            return
        elapsed = time.perf_counter() - self.started
        left = self.total - self.done
        eta = f"ETA {_duration(elapsed / self.done * left)}" if left else "done"
        print(f"optbench: [{self.done}/{self.total}] {record.optimizer} seed={record.seed} {record.status} "
              f"in {_duration(record.wall_s or 0.0)}; {eta}", file=self.stream, flush=True)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def run_sweep(specs: list[TrialSpec], out_path: Path, run_id: str | None = None,
              run_trial: Callable[[TrialSpec], Record] | None = None,
              on_record: Callable[[Record], None] | None = None, *, jobs: int = 1,
              executor: Executor | None = None, progress: TextIO | None = sys.stderr) -> list[Record]:
    """Run every spec not already `ok` in `out_path`, appending each record as soon as it exists.

    `run_trial` (a plain function) or `executor` says how a trial runs; by default each runs in a
    fresh local process forked from a preloaded forkserver. Up to `jobs` run at once. Ctrl-C stops
    the running children and raises SweepInterrupted; a failed append raises ResultsWriteError.
    """
    run_id = run_id or new_run_id()
    done = completed_trial_ids(out_path)
    pending = []
    for spec in specs:
        if spec.trial_id in done:
            if on_record is not None:
                on_record(_skipped_note(spec))
        else:
            pending.append(spec)
    if not pending:
        return []
    if executor is None:
        executor = FunctionExecutor(run_trial) if run_trial is not None else LocalExecutor()
    slots: queue.SimpleQueue[dict[str, str]] = queue.SimpleQueue()
    environments = child_environments(pending, jobs)
    for env in environments:
        slots.put(env)

    def in_slot(spec: TrialSpec) -> Record:
        env = slots.get()
        try:
            return executor.run(spec, env)
        finally:
            slots.put(env)

    records: list[Record] = []
    tracker = _Progress(len(pending), progress)
    pool = ThreadPoolExecutor(max_workers=len(environments), thread_name_prefix="trial")
    try:
        running: set[Future[Record]] = {pool.submit(in_slot, spec) for spec in pending}
        while running:
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            # Trials that finished are recorded before a failure among them (an interrupt) is raised.
            for future in sorted(finished, key=lambda f: f.exception() is not None):
                record = future.result()
                record.run_id = run_id
                try:
                    append_record(out_path, record)
                except OSError as exc:
                    raise ResultsWriteError(exc.errno, f"cannot append to {out_path}: {exc.strerror or exc}; "
                                                       f"{len(records)} trials recorded") from exc
                records.append(record)
                tracker.finished(record)
                if on_record is not None:
                    on_record(record)
    except KeyboardInterrupt:
        executor.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        raise SweepInterrupted(len(records)) from None
    except BaseException:
        executor.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    return records


def _skipped_note(spec: TrialSpec) -> Record:
    """A record for display only (never stored): this trial is already recorded ok."""
    return Record(trial_id=spec.trial_id, status="skipped", optimizer=spec.optimizer, seed=spec.seed,
                  workload=spec.workload, error="already recorded ok in this results file")
