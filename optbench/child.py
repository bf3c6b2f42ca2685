"""The trial child's bootstrap: its own process group, its log, its limits, and its start-up time.

Every local trial runs `run_child` in a fresh process, started one of two ways (see executors.py):
forked from a forkserver that imported torch, transformers and datasets once for the whole sweep
(the default), or as a fresh `python -m optbench.child ...` that pays those imports itself. Either
way the trial gets a clean process (its own peaks, a crash takes only it), and `startup_s` on its
record measures launch to the first line of real work.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import sys
import threading
import time
from pathlib import Path

# What every trial imports before its first line of work. Importing them must not initialise CUDA:
# a process forked after CUDA initialisation cannot use CUDA.
PRELOAD = ("torch", "transformers", "datasets", "optbench.trial", "optbench.workloads")
# bitsandbytes alone costs ~5.5 s on CPU; preloaded only for CPU sweeps (on import it probes CUDA).
PRELOAD_CPU_ONLY = ("bitsandbytes",)
PARENT_POLL_S = 1.0


def preload(modules: tuple[str, ...]) -> None:
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


def _die_with_parent() -> None:
    """Kill this trial's process group once the process that launched it is gone.

    A sweep killed with SIGKILL cannot stop its children; without this they would train on unseen.
    The parent is the sweep (spawned children) or the forkserver, which exits with the sweep.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


def cap_memory(device, max_memory_bytes: int) -> None:
    """Past `max_memory_bytes` the trial's allocations fail, so it is recorded `oom` instead of swapping.

    On CUDA through the caching allocator's per-process fraction (torch.OutOfMemoryError); elsewhere
    through RLIMIT_AS on top of the current address space: the loaded libraries already reserve ~2 GiB
    of mostly untouched address space, which a bare RLIMIT_AS of a few GiB would not even leave room for.
    """
    import torch

    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, max_memory_bytes / total), device)
        return
    limit = address_space_bytes() + max_memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run_child(spec_path: str, record_path: str, log_path: str, launched_at: float, env: dict[str, str],
              max_memory_bytes: int | None) -> None:
    """Run one trial in this (fresh) process and write its record to `record_path`."""
    if os.getpgrp() != os.getpid():
        os.setsid()  # its own process group: a timeout or interrupt kills the trial and its helpers
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.update(env)
    _die_with_parent()
    import torch

    from optbench.plan import TrialSpec
    from optbench.trial import resolve_device, run_trial

    if "OPTBENCH_TORCH_THREADS" in env:  # OMP_NUM_THREADS is read at import, too late for a forked child
        torch.set_num_threads(int(env["OPTBENCH_TORCH_THREADS"]))
    spec = TrialSpec.from_dict(json.loads(Path(spec_path).read_text()))
    if max_memory_bytes is not None:
        cap_memory(resolve_device(spec.device), max_memory_bytes)
    startup_s = time.time() - launched_at
    record = run_trial(spec)
    record.startup_s = startup_s
    Path(record_path).write_text(json.dumps(record.to_dict(), default=str))


def main(argv: list[str]) -> int:
    """`python -m optbench.child SPEC RECORD LOG LAUNCHED_AT [MAX_MEMORY_BYTES]` (the spawned way)."""
    spec_path, record_path, log_path, launched_at = argv[:4]
    preload(PRELOAD)
    max_memory = int(argv[4]) if len(argv) > 4 else None
    run_child(spec_path, record_path, log_path, float(launched_at), {}, max_memory)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
