"""The results record and its JSON Lines store.

One `Record` per trial; its fields *are* the schema (units in the names). The store appends one line
per finished trial under a file lock and fsyncs it, so killing a sweep loses at most the trials in
flight and concurrent writers never interleave; the reader skips torn or corrupt lines with a warning
instead of failing the whole file.

Older records are read through their upgrade steps (upgrade.py); SCHEMA_VERSION is the version written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optbench.records.environment import MACHINE_KEYS
from optbench.records.fields import RecordFieldError, field_problem
from optbench.records.text import GIB, MIB
from optbench.records.upgrade import upgrade

SCHEMA_VERSION = 5  # what each version changed, and how older records read back: upgrade.py
# How every record line begins (schema_version is Record's first field): a torn line that begins so is a record cut
# mid-write, not another tool's text.
RECORD_START = '{"schema_version": '
REFERENCE_OPTIMIZER = "adamw"  # what every table, paired difference and "% of" column compares against
STATUSES = ("ok", "oom", "diverged", "error", "timeout", "skipped")
FAILURES = ("error", "timeout")  # a harness or library failure (exit 3); oom, diverged and skipped are results
# What one job is: every setting that changes what its numbers mean except the optimizer, its lr and the
# seed. Report, compare, study and the side-by-side table group by it (`job_key`), never by a label.
JOB_KEY_FIELDS = ("workload", "workload_options", "model", "pretrained", "dataset", "device", "steps", "warmup_steps",
                  "batch_size", "seq_len", "eval_size", "precision", "schedule", "engine", "parallel", "world_size",
                  "fidelity", "resume_check")

__all__ = ["FAILURES", "GIB", "JOB_KEY_FIELDS", "MACHINE_KEYS", "MIB", "REFERENCE_OPTIMIZER", "SCHEMA_VERSION",
           "STATUSES", "Record", "ResultsFileError", "append_record", "completed_trial_ids",
           "is_record_data", "job_key", "read_records"]


@dataclass
class Record:
    schema_version: int = SCHEMA_VERSION
    upgraded_from_schema: int | None = None  # the schema a line was written in, when records/rewrite.py rewrote it
    run_id: str = ""
    trial_id: str = ""
    status: str = "error"
    error: str | None = None
    # what ran
    optimizer: str = ""
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)
    state_precision: str = ""
    workload: str = ""
    workload_options: dict[str, Any] = field(default_factory=dict)  # e.g. the tiny BERT's {"hidden_size": 128}
    model: str = ""
    dataset: str = ""
    dataset_sha256: str | None = None  # a local dataset file's content (TrialSpec's): None for no file
    seed: int = 0
    device: str = ""
    device_name: str = ""
    job_key: dict[str, Any] = field(default_factory=dict)  # results.job_key(): what report and compare group by
    # the job
    steps: int = 0
    warmup_steps: int = 0
    batch_size: int = 0
    seq_len: int = 0
    eval_size: int = 0
    lr: float = 0.0
    # where the lr came from: "tuned: <study file>" (the shipped table of tuned lrs), "registry default" (untuned),
    # "user" (--lr), "study" (a study's grid point or its choice), or "unresolved" (a failed trial's, lr 0.0)
    lr_source: str | None = None
    schedule: str = "linear"  # lr after the warm-up: constant | linear | cosine | wsd (optbench/trial/schedules.py)
    # model side
    num_params: int | None = None
    weights_bytes: int | None = None
    grads_bytes: int | None = None
    # Σ over parameter tensors of rows + columns (rank >= 2) or numel (vectors): the elements a factored
    # second moment (Adafactor) keeps, so the x-axis its state grows along in the scaling fit
    factored_numel: int | None = None
    # optimizer state, measured after training
    state_bytes: int | None = None
    state_bytes_per_param: float | None = None
    state_bytes_by_key: dict[str, int] = field(default_factory=dict)
    state_bytes_by_module: dict[str, int] = field(default_factory=dict)  # per module kind (memory/statemap.py)
    analytic_state_bytes: int | None = None
    analytic_state_bytes_per_param: float | None = None
    # memory
    peak_cuda_allocated_bytes: int | None = None
    peak_cuda_reserved_bytes: int | None = None
    peak_rss_bytes: int | None = None
    peak_rss_growth_bytes: int | None = None
    # Which CUDA figure is which: peak_cuda_* are torch's caching allocator's own counters, blind to memory
    # allocated around it. paged_state_bytes is the optimizer state held there instead (bitsandbytes' paged
    # optimizers keep their larger state tensors in CUDA unified memory, cudaMallocManaged; 0 where nothing is
    # paged, as on CPU). peak_device_used_growth_bytes is the driver's count of used device memory
    # (cudaMemGetInfo: total - free) at its highest reading (the window's start, after each step, at its end)
    # over the reading at the window's start: it sees everything, torch's cache included, so compare it with
    # peak_cuda_reserved_bytes growth, not with allocated. None off CUDA.
    paged_state_bytes: int | None = None
    peak_device_used_growth_bytes: int | None = None
    # RSS over the baseline right after the last optimizer step: what training holds between steps
    # (grads + state + what the allocator keeps), without the transient peak inside step()
    rss_growth_after_step_bytes: int | None = None
    # held (above) minus grads and state: allocator-cached activation and temporary buffers still resident
    held_other_bytes: int | None = None
    # Peak split into parts. peak_memory_bytes is, on CUDA, the allocator peak plus paged_state_bytes (state the
    # allocator never saw, resident on the GPU unless the driver pages it out under memory pressure); on CPU
    # weights + peak RSS growth (the post-setup baseline already holds the weights, and under ddp/zero1 the
    # gradients: records/peaks.py adds them back). other_peak_bytes = peak - weights - grads - state:
    # activations, temporaries, allocator slack.
    peak_memory_bytes: int | None = None
    other_peak_bytes: int | None = None
    predicted_peak_bytes: int | None = None  # optbench.memory.predict's figure for peak_memory_bytes, before training
    # time
    first_step_s: float | None = None  # the first step whose optimizer.step() ran (a skipped one created no state)
    # Steps whose optimizer.step() a GradScaler skipped (fp16: inf/NaN gradients): trained on, but out of
    # first_step_s and the medians, since they did no optimizer work
    skipped_steps: list[int] = field(default_factory=list)
    step_time_median_s: float | None = None
    step_time_iqr_s: float | None = None
    optimizer_step_median_s: float | None = None
    optimizer_step_iqr_s: float | None = None
    samples_per_s: float | None = None
    # quality
    train_loss_final: float | None = None
    loss_curve: list[float] = field(default_factory=list)
    eval_accuracy: float | None = None
    eval_f1: float | None = None
    # update fidelity (`run --fidelity`): the optimizer's parameter update u against an fp32 AdamW's u_ref
    # from the same parameters and gradients, per step; medians skip steps where u_ref was zero.
    # A fidelity trial also holds the shadow AdamW (params + two moments) and a parameter snapshot, so its
    # peak memory is inflated: `fidelity` marks such records, and they are a job of their own.
    fidelity: bool = False
    update_cosine_median: float | None = None
    update_rel_error_median: float | None = None
    update_cosine_curve: list[float | None] = field(default_factory=list)
    update_rel_error_curve: list[float | None] = field(default_factory=list)
    # how it ran (engine x parallel mode x precision)
    pretrained: bool | None = None  # False: the model started from random init (training from scratch)
    stage: str | None = None  # "tune" (an lr-grid trial of a study) | "final" | None (plain `run`)
    engine: str = "native"  # native | trainer | accelerate
    parallel: str = "none"  # none | ddp | zero1 | fsdp2
    world_size: int = 1
    per_rank: list[dict[str, Any]] = field(default_factory=list)  # each rank's state/memory/time figures
    # --state-map under --parallel: each parameter whose state precision or bytes per element changed against a
    # single process of the same optimizer (optbench.memory.sharding); [] none changed, None not checked.
    sharding_state_changes: list[dict[str, Any]] | None = None
    sharding_checked_params: int | None = None  # parameters the sharding check compared
    precision: str = "fp32"  # fp32 | bf16-autocast | fp16-autocast | bf16 (bf16 weights, no fp32 master)
    param_dtype: str = "float32"
    autocast_dtype: str | None = None
    # optimizer-side measurements beyond bytes
    fp32_state_fraction: float | None = None  # share of parameters whose state stays full precision
    optimizer_impl: str | None = None  # fused | foreach | per-tensor loop | per-parameter[, host-synced] | None
    optimizer_step_traffic_bytes: int | None = None  # bytes one step must read + write (analytic)
    # The device's memory bandwidth as the probe kernel sees it (fused AdamW's update, bytes counted as the step's;
    # a triad before device_bandwidth_kernel). The trial's own short probe, over its step's working set (before
    # levels: buffers far larger than the cache), before and after training, is a check only (probes/bandwidth.py).
    device_bandwidth_bytes_per_s: float | None = None  # the trial probe's median
    device_bandwidth_iqr_bytes_per_s: float | None = None
    device_copy_bandwidth_bytes_per_s: float | None = None  # schema 1's ceiling (one copy_): read, never written
    # The machine's calibrated ceiling (`optbench calibrate-bandwidth`: a high quantile of many passes), its 5-95 %
    # spread, and where it came from: the calibration file, or "uncalibrated: <why>". None: a record from before.
    device_bandwidth_calibrated_bytes_per_s: float | None = None
    device_bandwidth_calibrated_spread_bytes_per_s: float | None = None
    # the working set (all the kernel's operands) of the calibrated level the ceiling is from: the largest no
    # larger than the step's weights + grads + state; None: a record from before levels (the memory level's ceiling)
    device_bandwidth_working_set_bytes: int | None = None
    device_bandwidth_probe_working_set_bytes: int | None = None  # what the trial's own probe streamed (all operands)
    device_bandwidth_source: str | None = None
    device_bandwidth_kernel: str | None = None  # the calibration's probe kernel; None: before the field (a triad)
    device_bandwidth_probe_disagrees: bool | None = None  # the trial probe fell outside the calibration's 5-95 %
    # traffic / optimizer-step median / the stream kernel's calibrated ceiling (None: uncalibrated); never above 1
    roofline_fraction: float | None = None
    # that ratio above 1: the step outran a ceiling mis-measured for it, so no roofline; kept as measured (upgrade.py)
    ceiling_outrun_fraction: float | None = None
    # a record from before the stream kernel (schema < 4): its ratio over a triad's bandwidth, which the fused AdamW
    # step outstreams, so no roofline (it read up to 1.73); kept as measured (upgrade.py)
    triad_roofline_fraction: float | None = None
    # --paired-probe (probes/paired.py): the stream kernel's bandwidth right after each timed step, and the median
    # over those steps of the step's traffic / time / that bandwidth: the step against the machine at that moment
    paired_probe_bytes_per_s: list[float] = field(default_factory=list)
    paired_roofline_fraction: float | None = None
    paged: bool | None = None  # None: not a paged optimizer; False: asked for paging, fell back (why in paged_reason)
    paged_reason: str | None = None
    # per-step samples after warm-up (seconds), so `compare` can test against the distribution
    step_time_samples_s: list[float] = field(default_factory=list)
    optimizer_step_samples_s: list[float] = field(default_factory=list)
    # workload metrics: eval_metrics on the eval split; val_metrics on the validation split carved from
    # the training data (study trials). target_metric names the workload's headline metric in those dicts,
    # target_mode says whether larger ("max") or smaller ("min") is better.
    eval_metrics: dict[str, float] = field(default_factory=dict)
    val_metrics: dict[str, float] = field(default_factory=dict)
    val_metric: float | None = None  # val_metrics[target_metric]
    val_accuracy: float | None = None  # val_metrics["accuracy"] where the workload has one
    val_rows: int | None = None  # rows of the validation split: its binomial noise sets the study's near-tie band
    eval_rows: int | None = None  # rows of the eval split: its binomial noise tells a ceiling from a result near it
    # The target metric's bounds on the eval split, from the workload: the best any model can score where the data's
    # generator makes it exact (the embedded review task's clean-label share, the Markov corpus's own perplexity;
    # None for a user's data), and what a model that ignores its input scores (the majority class's share, the
    # unigram perplexity): a result near it did not train, and the report says `untrained`.
    metric_ceiling: float | None = None
    metric_chance: float | None = None
    val_chance: float | None = None  # the same on the validation split, which a study's tune stage is judged on
    target_metric: str = "accuracy"
    target_mode: str = "max"
    eval_curve: list[list[float]] = field(default_factory=list)  # [step, training seconds, target metric]
    target_value: float | None = None  # the threshold time-to-target was measured against
    steps_to_target: int | None = None
    time_to_target_s: float | None = None
    # checkpoint and resume (`--resume-check`): save at the middle step, load into fresh objects, finish,
    # and compare with the uninterrupted run of the same seed and batches
    resume_check: bool = False
    checkpoint_bytes: int | None = None  # on disk
    checkpoint_save_s: float | None = None
    checkpoint_load_s: float | None = None
    resume_max_abs_param_diff: float | None = None
    resume_final_loss_diff: float | None = None
    resume_status: str | None = None  # exact | close | diverged | error: <library message>
    resume_note: str | None = None  # e.g. "optimizer.eval() before saving (schedule-free)"
    # what a probe could not measure as it should (a peak that could not be reset, a cache size guessed): the
    # figures each names are to be read with care
    measurement_warnings: list[str] = field(default_factory=list)
    # bookkeeping
    startup_s: float | None = None  # trial launch to the child's first line of real work (imports, fork)
    wall_s: float | None = None
    slurm_job_id: str | None = None  # `--executor slurm`: the array task that ran it ("123_4"); None elsewhere
    slurm_restarts: int | None = None  # times the scheduler requeued that task before this run (preemption, ...)
    started_at: str = ""
    env: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe data; a non-finite float (a diverged loss) becomes None."""
        return _finite(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Record:
        """Read a record of any schema: unknown (newer) fields are left out, missing (older) ones filled,
        schema-1 meanings translated (see the module docstring), and the job key derived when absent. A value of
        the wrong type (records/fields.py) is a RecordFieldError."""
        names = {f.name for f in dataclasses.fields(cls)}
        data = upgrade(dict(data))
        problem = field_problem(cls, data)
        if problem is None and data.get("status", "error") not in STATUSES:  # every table groups by these
            problem = f"field status is {data['status']!r}, not one of {', '.join(STATUSES)}"
        if problem:
            raise RecordFieldError(problem)
        record = cls(**{k: v for k, v in data.items() if k in names})
        if "job_key" not in data:  # a schema-1 record: its key from its fields
            record.job_key = job_key(record)
        return record


def job_key(record: Record) -> dict[str, Any]:
    """The job a record belongs to (JOB_KEY_FIELDS); the device by its type, so cuda:0 and cuda:1 are one job."""
    key = {name: getattr(record, name) for name in JOB_KEY_FIELDS}
    key["device"] = str(record.device).split(":")[0]
    if record.dataset_sha256:  # two contents of one file are two jobs; keys of records without a file stay as they were
        key["dataset_sha256"] = record.dataset_sha256
    return key


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def append_record(path: Path, record: Record, *, once: bool = False) -> Record:
    """Append one record as one line, under an exclusive lock, fsynced before returning; returns what is stored.

    The lock (flock on the file itself) lets several sweeps, `--jobs` workers, executor callbacks or cluster
    nodes share one results file without interleaving their lines. A file left without a final newline (a
    writer killed mid-line) gets one first, so the torn fragment stays on a line of its own. A write
    that fails half-way (disk full) is cut back to where it started, so the fragment cannot corrupt
    the next append; the error still propagates, since the record was not stored.
    `once`: not when the file already holds this run's record of this trial (same run_id and trial_id), which is
    returned instead. Writers that may race for one trial (a cluster node storing its own record, the sweep
    recording the trial the scheduler ended, a requeued task running twice) then store it exactly once.
    """
    data = (json.dumps(record.to_dict(), allow_nan=False, default=str) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:  # read too: the last byte says whether a newline is missing
        fd = handle.fileno()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            start = os.lseek(fd, 0, os.SEEK_END)
            stored = _stored(fd, start, record) if once else None
            if stored is not None:
                return stored
            if start and os.pread(fd, 1, start - 1) != b"\n":
                data = b"\n" + data
            try:
                _write_all(fd, data)
                os.fsync(fd)
            except OSError:
                os.ftruncate(fd, start)
                raise
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    return record


def _stored(fd: int, size: int, record: Record) -> Record | None:
    """The record of `record`'s run and trial among the file's first `size` bytes, if one is there."""
    keys = (f'"trial_id": "{record.trial_id}"', f'"run_id": "{record.run_id}"')
    for line in os.pread(fd, size, 0).decode(errors="replace").splitlines():
        if all(key in line for key in keys):
            with contextlib.suppress(json.JSONDecodeError):
                data = json.loads(line)
                if (data.get("trial_id"), data.get("run_id")) == (record.trial_id, record.run_id):
                    return Record.from_dict(data)
    return None


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is out (a single write may be partial on a nearly full disk)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class ResultsFileError(ValueError):
    """A results file that is missing or holds something other than records: `reason`, at `line` (None: the file)."""

    def __init__(self, path: Path, reason: str, line: int | None = None) -> None:
        self.path, self.reason, self.line = path, reason, line
        super().__init__(f"{path}:{line}: {reason}" if line is not None else f"{path}: {reason}")


def is_record_data(data: Any) -> bool:
    """Whether a parsed JSON line is an optbench record at all (an object naming its trial and optimizer)."""
    return isinstance(data, dict) and "trial_id" in data and "optimizer" in data


def read_records(path: Path) -> list[Record]:
    """Every record in a JSON Lines file.

    Unreadable lines (a torn write, a line corrupted by hand or pasted from elsewhere, a field of the wrong type) are
    skipped with one warning naming their line numbers and the first one's fault, so one bad line never hides the
    rest of a sweep. A file with no readable record at all is refused, it is not a results file, with one exception:
    a file whose only line is a record cut mid-write (a sweep killed while writing its first one) reads as empty, so
    rerunning the sweep resumes it.
    """
    if not path.is_file():
        raise ResultsFileError(path, "no such results file")
    try:  # -sig: an editor's byte-order mark is not a fault
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:  # a binary or Latin-1 file: no results file, said like any other
        raise ResultsFileError(path, f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    records = []
    faults: dict[int, str] = {}  # line number: what is wrong with it
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            faults[number] = f"not a JSON line ({exc.msg})"
            continue
        if not is_record_data(data):
            faults[number] = "not an optbench record (no trial_id/optimizer)"
            continue
        try:
            records.append(Record.from_dict(data))
        except RecordFieldError as exc:
            faults[number] = str(exc)
    first = next(iter(faults), None)
    torn_last = list(faults) == [len(lines)] and faults[first].startswith("not a JSON line")  # type: ignore[index]
    if first is not None and not records and not (torn_last and lines[-1].startswith(RECORD_START)):
        raise ResultsFileError(path, faults[first], first)
    if torn_last:
        warnings.warn(f"{path}:{len(lines)}: skipping a torn last line (sweep killed mid-write?)", stacklevel=2)
    elif faults:
        warnings.warn(f"{path}: skipping {len(faults)} unreadable line(s): {', '.join(map(str, faults))} (torn or "
                      f"corrupted writes; line {first}: {faults[first]})", stacklevel=2)  # type: ignore[index]
    return records


def completed_trial_ids(path: Path) -> set[str]:
    """Trial ids already recorded `ok` in `path`: a re-run skips these (resume)."""
    if not path.is_file():
        return set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {r.trial_id for r in read_records(path) if r.status == "ok"}
