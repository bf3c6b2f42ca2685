"""The bootstrap of every process optbench starts for a trial, written once: a trial child and a torchrun rank.

A trial child (forked from the preloaded forkserver, or a fresh `python -m optbench.sweep.child run ...`) gets
its own process group, its log, its thread share, its memory cap and a watchdog, runs `trial.run_trial` and hands
the record back through a file. A torchrun rank does the same around a parallel trial and joins the group first.

The watchdog is what keeps a killed sweep from leaving trials behind. SIGKILL cannot be caught, so the sweep
cannot stop its children; each child instead watches the sweep's own pid (passed down in OPTBENCH_SWEEP_PID)
through a pidfd, which wakes the moment the sweep exits, and then kills its own process group. Watching the
parent is not enough: a forked child's parent is the forkserver, which outlives the sweep for as long as any
child holds its pipe, and a rank's parent is torchrun, which waits for its ranks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import resource
import select
import signal
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# What every trial imports before its first line of work. Importing them must not initialise CUDA:
# a process forked after CUDA initialisation cannot use CUDA.
PRELOAD = ("torch", "transformers", "datasets", "optbench.trial.run", "optbench.workloads", "optbench.sweep.warm")
SWEEP_PID_ENV = "OPTBENCH_SWEEP_PID"  # the sweep every child and rank watches
THREADS_ENV = "OPTBENCH_TORCH_THREADS"  # a CPU thread share when trials run side by side (--jobs)
POLL_S = 0.5  # the watchdog's polling interval where pidfds are not available
# What each rank reports (read from its own record after the trial): the per-rank view of the report.
RANK_FIELDS = ("status", "error", "state_bytes", "state_bytes_by_key", "peak_rss_bytes", "peak_rss_growth_bytes",
               "peak_cuda_allocated_bytes", "peak_cuda_reserved_bytes", "first_step_s", "step_time_median_s",
               "optimizer_step_median_s", "train_loss_final", "eval_accuracy", "skipped_steps", "paged_state_bytes",
               "peak_device_used_growth_bytes")


def preload(modules: Iterable[str]) -> None:
    """Import `modules`, skipping any that are missing (an optional library just is not preloaded)."""
    import importlib

    for name in modules:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def address_space_bytes() -> int:
    """The process's current virtual size (VmSize): what the libraries already map before any trial work."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _wait_until_any_gone(pids: list[int]) -> None:
    """Block until one of `pids` has exited (a zombie counts: it will never run again)."""
    fds = []
    try:
        fds = [os.pidfd_open(pid) for pid in pids]
    except ProcessLookupError:
        return  # already gone
    except (AttributeError, OSError):  # no pidfds here (old kernel, not Linux): poll
        while all(_alive(pid) for pid in pids):
            time.sleep(POLL_S)
        return
    select.select(fds, [], [])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_groups_when_gone(watched: list[int], groups: list[int]) -> None:
    """A daemon thread that SIGKILLs `groups` (process group ids; this process's own last) once any `watched`
    process is gone."""

    def watch() -> None:
        _wait_until_any_gone(watched)
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="optbench-watchdog", daemon=True).start()


def _sweep_pid() -> int | None:
    text = os.environ.get(SWEEP_PID_ENV, "")
    return int(text) if text.isdigit() else None


RUST_BACKTRACE_ENV = ("RUST_BACKTRACE", "RUST_LIB_BACKTRACE")


def cap_memory(device: Any, max_memory_bytes: int) -> None:
    """Past `max_memory_bytes` the trial's allocations fail, so it is recorded `oom` instead of swapping.

    On CUDA through the caching allocator's per-process fraction of the trial's own GPU (torch wants a device
    with an index); elsewhere through RLIMIT_AS on top of the current address space: the loaded libraries already
    reserve ~2 GiB of mostly untouched address space, which a bare RLIMIT_AS of a few GiB would not leave room for.
    """
    import torch

    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, max_memory_bytes / total), index)
        return
    # Rust's allocation-failure hook (tokenizers) prints a backtrace where RUST_BACKTRACE asks for one; capturing it
    # allocates, fails again under the cap, and the nested hook waits forever on the backtrace lock the first holds:
    # the trial hung until its timeout instead of ending `oom` (one tiny trial in 6-10 with RUST_BACKTRACE=1).
    for name in RUST_BACKTRACE_ENV:
        os.environ.pop(name, None)
    limit = address_space_bytes() + max_memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _apply_settings(spec: Any, device: Any) -> None:
    """The trial process's own settings: its threads (--threads, else a --jobs or Slurm share) and the memory cap
    (--max-memory)."""
    import torch

    threads = spec.threads or os.environ.get(THREADS_ENV)
    if threads:  # OMP_NUM_THREADS is read at import, too late for a forked child
        torch.set_num_threads(int(threads))
    if spec.max_memory_bytes:
        cap_memory(device, spec.max_memory_bytes)


def _thread_lock_for_progress_bars() -> None:
    """tqdm guards its bars with a multiprocessing lock: a named semaphore registered with the sweep's resource
    tracker. A trial killed mid-run (a timeout, Ctrl-C) never unregisters it, and the tracker then warns about a
    leaked semaphore after the sweep's last line. One process draws one bar: a thread lock does (tqdm's public
    `set_lock`, before the trial draws any bar)."""
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def _write_record(record: Any, record_path: Path) -> None:
    """Written beside and renamed into place, so the launcher never reads half a record."""
    partial = record_path.with_suffix(".partial")
    partial.write_text(json.dumps(record.to_dict(), default=str))
    partial.replace(record_path)


def _device_for(spec: Any) -> Any:
    """The trial's device for the memory cap; a bad name is left to the trial, which records it."""
    from optbench.job.devices import resolve_device

    try:
        return resolve_device(spec.device)
    except ValueError:
        import torch

        return torch.device("cpu")


def _adopt_environment(env: dict[str, str]) -> None:
    """This forked child's environment becomes exactly `env`, the one the sweep handed it: what it inherited is
    the forkserver's (the sweep's when the server started, plus the server's own settings)."""
    os.environ.clear()
    os.environ.update(env)


def run_child(spec_path: str, record_path: str, log_path: str, launched_at: float,
              env: dict[str, str] | None) -> None:
    """Run one trial in this (fresh) process and write its record to `record_path`. `env`: the whole environment
    for a forked child; None for a spawned one, which was started with it."""
    if os.getpgrp() != os.getpid():
        os.setsid()  # its own process group: a timeout or interrupt kills the trial and its helpers
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    if env is not None:
        _adopt_environment(env)
    sweep = _sweep_pid()
    if sweep is not None:
        kill_groups_when_gone([sweep], [os.getpgrp()])
    _thread_lock_for_progress_bars()
    from optbench.job.spec import TrialSpec
    from optbench.trial.run import run_trial

    spec = TrialSpec.from_dict(json.loads(Path(spec_path).read_text()))
    _apply_settings(spec, _device_for(spec))
    startup_s = time.time() - launched_at
    record = run_trial(spec)
    record.startup_s = startup_s
    _write_record(record, Path(record_path))


def rank_main(spec_path: str, record_path: str) -> int:
    """A torchrun worker: watch the sweep and torchrun, pin this rank's GPU (before the memory cap, which needs
    it), join the group, run the trial, gather every rank's figures; rank 0 writes the record."""
    import torch
    import torch.distributed as dist

    from optbench.job.devices import device_kind
    from optbench.job.spec import TrialSpec
    from optbench.trial.run import run_trial

    launcher = os.getppid()  # torchrun, started in a session of its own: its pid is its group
    sweep = _sweep_pid()
    # torchrun starts each rank in a session of its own: a rank must take torchrun (and itself) down when the
    # sweep is gone, and leave when torchrun is (the runner's timeout kills torchrun's group only).
    kill_groups_when_gone([launcher] + ([sweep] if sweep else []), [launcher, os.getpgrp()])
    spec = TrialSpec.from_dict(json.loads(Path(spec_path).read_text()))
    cuda = device_kind(spec.device) == "cuda"
    if cuda:  # "cuda" then means this rank's GPU everywhere (the planner refuses cuda:N with --parallel)
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    _apply_settings(spec, _device_for(spec))
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    try:
        record = run_trial(spec)
        if record.status != "ok":  # said before the gather: a rank still inside a collective dies on this rank's
            # absence, and the first cause the group's log names (executors.cause_in_log) must be this one
            print(f"[rank{dist.get_rank()}]: trial {record.status}: {record.error}", file=sys.stderr, flush=True)
        merged = gather(record)
        if dist.get_rank() == 0:
            _write_record(merged, Path(record_path))
    finally:
        dist.destroy_process_group()
    return 0


def gather(record: Any) -> Any:
    """Every rank's figures into `per_rank` (rank order); the record fails if any rank failed."""
    import torch.distributed as dist

    mine = {"rank": dist.get_rank(), **(record.per_rank[0] if record.per_rank else {}),
            **{name: getattr(record, name) for name in RANK_FIELDS}}
    ranks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    merged = dataclasses.replace(record, per_rank=ranks, world_size=len(ranks))
    failed = next((r for r in ranks if r["status"] != "ok"), None)
    if failed is not None and record.status == "ok":
        merged.status, merged.error = failed["status"], f"rank {failed['rank']}: {failed['error']}"
    return merged


def main(argv: list[str]) -> int:
    """`python -m optbench.sweep.child run SPEC RECORD LOG LAUNCHED_AT` (a spawned trial child) or
    `... rank SPEC RECORD` (each rank of a torchrun group)."""
    from optbench.optimizers.noise import filter_known_noise

    filter_known_noise()  # before the trial's imports: its log's last lines must be about the trial
    kind, rest = argv[0], argv[1:]
    if kind == "rank":
        return rank_main(rest[0], rest[1])
    preload(PRELOAD)
    run_child(rest[0], rest[1], rest[2], float(rest[3]), None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
