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
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import NoReturn, TextIO

from optbench.job.devices import cuda_device_count, device_kind, usable_cpu_cores
from optbench.job.spec import TrialSpec
from optbench.records.record import Record, append_record, completed_trial_ids
from optbench.sweep.devices import GpuLocks, check_devices, gpu_slots, trial_environment, visible_gpus
from optbench.sweep.executors import ArrayExecutor, Executor, FunctionExecutor, LocalExecutor, failed_record
from optbench.sweep.progress import ALREADY_OK, Progress


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep: running children were stopped; `recorded` trials made it to the file."""

    def __init__(self, recorded: int):
        super().__init__(recorded)
        self.recorded = recorded


class ResultsWriteError(OSError):
    """A record could not be appended (disk full, file gone read-only): the sweep stops, nothing is torn."""


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]


def slot_count(specs: list[TrialSpec], jobs: int, visible: list[str]) -> int:
    """Trials at once: `jobs`, but on CUDA never more than the `visible` GPUs hold (a torchrun group takes N)."""
    if not any(device_kind(s.device, len(visible)) == "cuda" for s in specs):
        return jobs
    return gpu_slots(visible, jobs, max(s.nproc for s in specs))


def run_sweep(specs: list[TrialSpec], out_path: Path, run_id: str | None = None,
              run_trial: Callable[[TrialSpec], Record] | None = None,
              on_record: Callable[[Record], None] | None = None, *, jobs: int = 1,
              executor: Executor | ArrayExecutor | None = None, progress: TextIO | None = sys.stderr,
              skipped: Sequence[tuple[TrialSpec, str]] = ()) -> list[Record]:
    """Run every spec not already `ok` in `out_path`, appending each record as soon as it exists.

    `run_trial` (a plain function) or `executor` says how a trial runs; by default each runs in a
    fresh local process forked from a preloaded forkserver. Up to `jobs` run at once; an ArrayExecutor
    (a cluster's) takes them all at once and cancels its jobs on Ctrl-C. `skipped`: the
    (spec, reason) pairs that cannot run here, recorded `skipped` first. Every record gets this sweep's
    run id. Ctrl-C stops the running children and raises SweepInterrupted; a failed append raises
    ResultsWriteError.
    """
    pending = _pending(specs, out_path, on_record)
    printer = None if progress is None else Progress(len(pending) + len(skipped), _printer(progress))
    store = _Store(out_path, run_id or new_run_id(), printer, on_record)
    for spec, reason in skipped:
        store.add(failed_record(spec, "skipped", f"unavailable here: {reason}"))
    if pending and isinstance(executor, ArrayExecutor):
        _run_arrays(executor, pending, store)
    elif pending:
        if executor is None:
            executor = FunctionExecutor(run_trial) if run_trial is not None else LocalExecutor()
        _run_in_slots(pending, executor, store, jobs)
    return store.records


def _run_in_slots(pending: list[TrialSpec], executor: Executor, store: _Store, jobs: int) -> None:
    """Up to `jobs` trials at once, each slot with its GPU(s) or thread share; every record stored as it lands."""
    # The GPUs the user's mask allows, read once before any trial starts (nothing changes os.environ meanwhile).
    visible = visible_gpus(os.environ, cuda_device_count() if any(s.device != "cpu" for s in pending) else 0)
    check_devices((s.device for s in pending), visible)  # a cuda:N past the mask fails before any trial starts
    slots = slot_count(pending, jobs, visible)
    gpu_locks = GpuLocks()
    # the cores this process may use (its affinity mask), which the --threads warning counts too: a container or
    # `taskset` that grants 2 of 64 cores gives each of 2 slots 1 thread, not 32
    cpu_cores = usable_cpu_cores()
    free: queue.SimpleQueue[int] = queue.SimpleQueue()
    for slot in range(slots):
        free.put(slot)

    def in_slot(spec: TrialSpec) -> Record:
        slot = free.get()
        try:
            env = trial_environment(spec.device, spec.nproc, slot, visible, slots, cpu_cores)
            with gpu_locks.hold(env):  # a pinned cuda:N waits for GPU N, whatever its slot
                return executor.run(spec, env)
        finally:
            free.put(slot)

    pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="trial")
    try:
        running: set[Future[Record]] = {pool.submit(in_slot, spec) for spec in pending}
        while running:
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            # Trials that finished are recorded before a failure among them (an interrupt) is raised.
            for future in sorted(finished, key=lambda f: f.exception() is not None):
                store.add(future.result())
    except BaseException as exc:
        executor.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        _raise_stopped(exc, store)
    pool.shutdown()


def _printer(stream: TextIO) -> Callable[[str], None]:
    return lambda line: print(f"optbench: {line}", file=stream, flush=True)


def _run_arrays(executor: ArrayExecutor, pending: list[TrialSpec], store: _Store) -> None:
    """Every pending trial to the cluster at once; each record stored once as it settles (its node may have stored
    it already: `append_record(once=True)`)."""
    store.once = True
    try:
        for record in executor.run_all(pending, store.run_id, store.out_path):
            store.add(record)
    except BaseException as exc:
        executor.stop()
        _raise_stopped(exc, store)


def _raise_stopped(exc: BaseException, store: _Store) -> NoReturn:
    """After the executor stopped: an interrupt becomes SweepInterrupted (what was recorded), the rest re-raised."""
    if isinstance(exc, KeyboardInterrupt):
        raise SweepInterrupted(len(store.records)) from None
    raise exc


def _pending(specs: list[TrialSpec], out_path: Path, on_record: Callable[[Record], None] | None) -> list[TrialSpec]:
    """The specs not yet recorded `ok` in `out_path`; the others are announced as already done."""
    done = completed_trial_ids(out_path)
    for spec in specs:
        if spec.trial_id in done and on_record is not None:
            on_record(_skipped_note(spec))
    return [spec for spec in specs if spec.trial_id not in done]


class _Store:
    """Appends each finished trial's record (one line, locked, fsynced), then reports it."""

    def __init__(self, out_path: Path, run_id: str, tracker: Progress | None,
                 on_record: Callable[[Record], None] | None) -> None:
        self.out_path, self.run_id, self.tracker, self.on_record = out_path, run_id, tracker, on_record
        self.records: list[Record] = []
        self.once = False  # store a trial only if this run has not stored it yet (records.append_record)

    def add(self, record: Record) -> None:
        record.run_id = self.run_id
        try:
            record = append_record(self.out_path, record, once=self.once)
        except OSError as exc:
            raise ResultsWriteError(exc.errno, f"cannot append to {self.out_path}: {exc.strerror or exc}; "
                                               f"{len(self.records)} trials recorded") from exc
        self.records.append(record)
        if self.tracker is not None:
            self.tracker(record)
        if self.on_record is not None:
            self.on_record(record)


def _skipped_note(spec: TrialSpec) -> Record:
    """A record for display only (never stored): this trial is already recorded ok."""
    return Record(trial_id=spec.trial_id, status="skipped", optimizer=spec.optimizer, seed=spec.seed,
                  workload=spec.workload, stage=spec.stage, lr=spec.lr or 0.0, error=ALREADY_OK)
