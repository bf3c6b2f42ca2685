"""The record of a trial's settings, before anything is measured: what every record starts as, and all a record
holds of a trial that never ran (skipped here, stopped, timed out, crashed before writing its own).

torch-free: the sweep writes such records itself, and its process has no use for the training stack. An `auto`
device is the one question that asks torch (how many GPUs, through NVML), as it must: it is where the trial would
have run, and a failed trial's record still lands in its job (compare, report).
"""

from __future__ import annotations

import contextlib
import time
from datetime import datetime, timezone

from optbench.job.devices import device_kind
from optbench.job.spec import TrialSpec
from optbench.optimizers import resolve
from optbench.records.environment import environment
from optbench.records.record import Record, job_key
from optbench.workloads import LR_UNRESOLVED, LR_USER, WorkloadError, get_workload, lr_for


def settings_record(spec: TrialSpec, started_at: float | None = None) -> Record:
    """A record holding the trial's settings (a failed trial keeps these); `started_at`: when it started (epoch
    seconds), now by default. Its environment stamp names no runtime (no threads, kernels or GPU were used)."""
    try:
        entry = resolve(spec.optimizer)
    except ValueError:
        entry = None
    name, precision = (entry.name, entry.precision) if entry is not None else (spec.optimizer, "")
    # An lr nothing could resolve (no --lr, and the optimizer or the workload unknown) is recorded as 0.0 from
    # LR_UNRESOLVED, never as the user's: the record must not say someone chose it.
    lr, source = (spec.lr, spec.lr_source or LR_USER) if spec.lr else (0.0, LR_UNRESOLVED)
    if entry is not None:
        with contextlib.suppress(WorkloadError):
            lr, source = lr_for(spec, entry)
    started = datetime.fromtimestamp(time.time() if started_at is None else started_at, timezone.utc)
    record = Record(
        trial_id=spec.trial_id, optimizer=name, optimizer_kwargs=dict(spec.optimizer_kwargs),
        state_precision=precision, workload=spec.workload, workload_options=dict(spec.workload_options),
        model=spec.model or spec.workload, dataset=spec.dataset or "embedded-reviews",
        dataset_sha256=spec.dataset_sha256, seed=spec.seed,
        device=device_kind(spec.device) if spec.device == "auto" else spec.device, steps=spec.steps,
        warmup_steps=spec.warmup_steps, batch_size=spec.batch_size, seq_len=spec.seq_len, eval_size=spec.eval_size,
        lr=lr, schedule=spec.schedule, fidelity=spec.fidelity, started_at=started.isoformat(timespec="seconds"),
        stage=spec.stage, engine=spec.engine, parallel=spec.parallel, world_size=spec.nproc,
        precision=spec.precision, resume_check=spec.resume_check, env=environment(runtime=False),
    )
    record.lr_source = source
    try:
        workload = get_workload(spec.workload)
        record.target_metric, record.target_mode = workload.target_metric, workload.target_mode
        record.model, record.dataset = workload.model_name(spec), workload.dataset_name(spec)
        record.pretrained = workload.is_pretrained(spec)
    except WorkloadError:
        pass
    record.job_key = job_key(record)
    return record
