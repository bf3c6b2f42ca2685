"""What runs on a Slurm node for one array task: the trial in a fresh child, its record stored and handed back.

The node stores the record itself (`append_record(once=True)`, under the results file's lock), so a trial that
finished is kept even if the submit host is gone by then; the sweep on the submit host stores every trial once
more the same way, which is a no-op where the node got there first, and the only store for a trial the scheduler
ended without a record. A job the scheduler ends (scancel, requeue, preemption, its time limit) gets SIGTERM: the
node then leaves at once without a record, its trial child following through its watchdog, and the sweep reads
from the scheduler what happened — a requeued task runs again and is recorded once, by its run that finished.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from optbench.job.devices import GPU_PINNED_ENV
from optbench.job.spec import TrialSpec
from optbench.records.record import append_record
from optbench.sweep.child import THREADS_ENV
from optbench.sweep.executors import LocalExecutor

# A trial child killed together with its job dies in the same instant as this process is told to stop; a failed
# record waits this long before it is stored, so that the SIGTERM ends this process first.
TERM_GRACE_S = 2.0


@dataclass(frozen=True)
class NodeTask:
    """Everything one array task needs: plain data, pickled by submitit into the task's folder."""

    spec: dict
    run_id: str
    out_path: str  # the results file, absolute, on storage the nodes share with the submit host
    log_dir: str  # one log per trial (executors.trial_log_name)
    gpus: int  # GPUs the task asked for: none means the trial must not touch a GPU of this node


def node_environment(gpus: int, environ: Mapping[str, str], nproc: int = 1) -> dict[str, str]:
    """What the trial child adds to this job's environment: torch threads for the CPUs Slurm gave the job, shared
    among a torchrun group's `nproc` ranks, and either its GPUs pinned (Slurm's CUDA_VISIBLE_DEVICES holds exactly
    them) or no GPU at all (a CPU task on a GPU node, or one that inherited the submit host's mask)."""
    cpus = int(environ.get("SLURM_CPUS_ON_NODE") or environ.get("SLURM_CPUS_PER_TASK") or 1)
    threads = str(max(1, cpus // nproc))
    env = {THREADS_ENV: threads, "OMP_NUM_THREADS": threads}
    if gpus:
        env[GPU_PINNED_ENV] = "1"
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def slurm_job_id(environ: Mapping[str, str]) -> str | None:
    """This task as squeue names it: `123_4` for an array task, `125` for a lone job."""
    array, index = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{index}" if array and index else environ.get("SLURM_JOB_ID")


def _ended_by_scheduler(signum: int, frame: object) -> NoReturn:
    print(f"optbench: the scheduler ended this job ({signal.Signals(signum).name}); no record stored here",
          file=sys.stderr, flush=True)
    os._exit(128 + signum)


def run_on_node(task: NodeTask) -> dict:
    """The array task's function: one trial in a fresh local child (timeout, crash isolation), its record stored
    once in the results file and returned. submitit's own handlers would ignore SIGTERM and treat SIGUSR2 (sent
    90 s before the time limit) as a checkpoint request: here SIGTERM ends the task and SIGUSR2 is ignored, so a
    task that overruns ends TIMEOUT at its limit, which the sweep records."""
    signal.signal(signal.SIGTERM, _ended_by_scheduler)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    spec = TrialSpec.from_dict(task.spec)
    executor = LocalExecutor(startup="spawn", echo=False, log_dir=Path(task.log_dir))
    record = executor.run(spec, node_environment(task.gpus, os.environ, spec.nproc))
    if record.status != "ok":
        time.sleep(TERM_GRACE_S)
    record.run_id = task.run_id
    record.slurm_job_id = slurm_job_id(os.environ)
    record.slurm_restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    return append_record(Path(task.out_path), record, once=True).to_dict()
