"""What the Slurm scheduler says about our jobs, asked with its own commands, and what each answer means for a trial.

Job states come from `squeue`, not `sacct`: sacct needs accounting storage (slurmdbd and a database server), which
many small clusters and the one-node test cluster (scripts/slurm-local) do not run, and without it every sacct call
fails. The controller answers squeue itself, and lists a finished job, with its final state, for MinJobAge seconds
(300 by default) — long past the few seconds between two polls. A partition's GPUs come from `sinfo`'s gres column.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

COMMAND_TIMEOUT_S = 60  # a busy controller answers in seconds; past this the poll is skipped, not the sweep
# States after which a task never runs again on its own (a requeue by hand is a new attempt the sweep ignores).
ENDED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                   "DEADLINE", "PREEMPTED", "SPECIAL_EXIT", "REVOKED"})
WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
# Pending reasons that waiting in line does not clear: the partition is down, the nodes it needs are gone, the job
# is held, its request can never be met. Priority, Resources, JobArrayTaskLimit (our own cap), BeginTime (a requeued
# task's delay), Dependency and the QOS/association limits clear as other jobs finish: those are left to wait.
STUCK_REASONS = ("PartitionDown", "PartitionInactive", "PartitionNodeLimit", "PartitionTimeLimit", "ReqNodeNotAvail",
                 "NodeDown", "BadConstraints", "InvalidAccount", "InvalidQOS", "JobHeld", "DependencyNeverSatisfied",
                 "FrontEndDown", "Nodes_required_for_job_are_DOWN")
# A finished task's state -> the trial's status and what the record says happened.
ENDED_STATUS = {
    "CANCELLED": ("error", "cancelled on the cluster (scancel, or by an administrator)"),
    "TIMEOUT": ("timeout", "the job reached its Slurm time limit"),
    "DEADLINE": ("timeout", "the job reached its deadline"),
    "OUT_OF_MEMORY": ("oom", "the job ran out of its Slurm memory allocation"),
    "PREEMPTED": ("error", "preempted, and the partition does not requeue preempted jobs"),
    "NODE_FAIL": ("error", "its node failed"),
    "BOOT_FAIL": ("error", "its node failed to boot"),
}


class SchedulerError(RuntimeError):
    """A Slurm command failed (controller unreachable, busy): the message is its one-line complaint."""


@dataclass(frozen=True)
class TaskState:
    """One array task (or plain job) as squeue lists it."""

    state: str  # squeue's %T: PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, ...
    reason: str  # %r: why it waits (Priority, PartitionDown, ...); "None" when nothing holds it

    @property
    def waiting(self) -> bool:
        return self.state in WAITING

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def stuck(self) -> bool:
        """Pending on a reason that no amount of waiting in line clears."""
        return self.waiting and self.reason.startswith(STUCK_REASONS)


def _run(command: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise SchedulerError(f"{command[0]} did not answer in {COMMAND_TIMEOUT_S} s") from None
    except OSError as exc:
        raise SchedulerError(f"cannot run {command[0]}: {exc.strerror or exc}") from None


def complaint(stderr: str) -> str:
    """A Slurm command's error output as one line: its `error:` lines, their `sbatch: error:` prefixes dropped."""
    lines = [re.sub(r"^\w+: error: ", "", line.strip()) for line in stderr.splitlines() if "error" in line.lower()]
    lines = list(dict.fromkeys(line for line in lines if line)) or [line.strip() for line in stderr.splitlines()][-1:]
    return "; ".join(lines) or "no message"


def parse_squeue(text: str) -> dict[str, TaskState]:
    """`squeue -h -r -o %i|%T|%r` output -> {"123_4": TaskState, "125": TaskState}."""
    states = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0]:
            states[parts[0]] = TaskState(state=parts[1], reason=parts[2])
    return states


def task_states(job_ids: Iterable[str]) -> dict[str, TaskState]:
    """Every task of these jobs (`123`: all of array 123's tasks) that the controller still lists, finished ones
    included (MinJobAge)."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    done = _run(["squeue", "-h", "-r", "--states=all", "-j", ",".join(ids), "-o", "%i|%T|%r"])
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:  # squeue's answer when none of them is listed any more
            return {}
        raise SchedulerError(f"squeue failed: {complaint(done.stderr)}")
    return parse_squeue(done.stdout)


def still_queued(job_ids: Iterable[str]) -> list[str]:
    """The tasks of these jobs that are pending, running or completing (what a plain `squeue` lists)."""
    ids = sorted(set(job_ids))
    if not ids:
        return []
    done = _run(["squeue", "-h", "-r", "-j", ",".join(ids), "-o", "%i"])
    if done.returncode != 0 and "Invalid job id" not in done.stderr:
        raise SchedulerError(f"squeue failed: {complaint(done.stderr)}")
    return done.stdout.split() if done.returncode == 0 else []


def cancel(job_ids: Iterable[str]) -> None:
    """scancel these jobs or array tasks (`123` cancels every task of array 123)."""
    ids = sorted(set(job_ids))
    if ids:
        done = _run(["scancel", *ids])
        if done.returncode != 0:
            raise SchedulerError(f"scancel failed: {complaint(done.stderr)}")


def gres_gpus(gres: str) -> int:
    """GPUs per node in a gres string: `gpu:a100:4(S:0-1),shard:8` -> 4; `(null)` -> 0."""
    counts = [int(found.group(1)) for entry in gres.split(",")
              if (found := re.match(r"gpu(?::[^:(]+)?:(\d+)", entry.strip()))]
    return max(counts, default=0)


def parse_sinfo_gpus(text: str, partition: str | None) -> int | None:
    """`sinfo -h -o %P|%G` output -> the most GPUs one node of `partition` (the default one, marked `*`, when
    None) has; None when no such partition is listed."""
    found = None
    for line in text.splitlines():
        name, _, gres = line.strip().partition("|")
        default = name.endswith("*")
        if (partition is None and default) or name.rstrip("*") == partition:
            found = max(found or 0, gres_gpus(gres))
    return found


def partition_gpus(partition: str | None) -> int | None:
    """The most GPUs a node of this partition (None: the default partition) has; None when sinfo does not list it
    (an unknown partition: its submission will be refused, and recorded so)."""
    done = _run(["sinfo", "-h", "-o", "%P|%G"])
    if done.returncode != 0:
        raise SchedulerError(f"sinfo failed: {complaint(done.stderr)}")
    return parse_sinfo_gpus(done.stdout, partition)


def ended_status(state: TaskState) -> tuple[str, str]:
    """A task that ended without a record: the trial's status, and the words for its error."""
    status, words = ENDED_STATUS.get(state.state, ("error", f"Slurm ended the job {state.state}"))
    reason = f" ({state.reason})" if state.reason not in ("None", "") else ""
    return status, words + reason
