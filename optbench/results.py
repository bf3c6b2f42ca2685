"""The results record, its JSON Lines store and the environment stamp every record carries.

One `Record` per trial; its fields *are* the schema (units in the names). The store appends one line
per finished trial under a file lock and fsyncs it, so killing a sweep loses at most the trials in
flight and concurrent writers never interleave; the reader skips torn or corrupt lines with a warning
instead of failing the whole file.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import functools
import json
import math
import os
import platform
import subprocess
import sys
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
MIB = 2**20
GIB = 2**30
REFERENCE_OPTIMIZER = "adamw"  # what every table, paired difference and "% of" column compares against
# Environment-stamp keys that change what a number means: the benchmarks add them to pytest-benchmark's
# machine_info (which has the CPU already), and `compare` warns when two runs differ in any of them.
# What makes two runs' numbers comparable: hardware (the CPU's family/model/stepping and the kernel set torch
# dispatches to, which changes floating-point results), libraries and threads.
MACHINE_KEYS = ("gpu", "cuda", "cpu_model", "cpu_capability", "torch", "transformers", "datasets", "bitsandbytes",
                "torchao", "torch_threads")
STATUSES = ("ok", "oom", "diverged", "error", "timeout", "skipped")


@dataclass
class Record:
    schema_version: int = SCHEMA_VERSION
    run_id: str = ""
    trial_id: str = ""
    status: str = "error"
    error: str | None = None
    # what ran
    optimizer: str = ""
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)
    state_precision: str = ""
    workload: str = ""
    model: str = ""
    dataset: str = ""
    seed: int = 0
    device: str = ""
    device_name: str = ""
    # the job
    steps: int = 0
    warmup_steps: int = 0
    batch_size: int = 0
    seq_len: int = 0
    lr: float = 0.0
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
    analytic_state_bytes: int | None = None
    analytic_state_bytes_per_param: float | None = None
    # memory
    peak_cuda_allocated_bytes: int | None = None
    peak_cuda_reserved_bytes: int | None = None
    peak_rss_bytes: int | None = None
    peak_rss_growth_bytes: int | None = None
    # RSS over the baseline right after the last optimizer step: what training holds (grads + state),
    # without the transient peak inside step() (bitsandbytes' CPU kernel dequantises to fp32 there)
    rss_growth_after_step_bytes: int | None = None
    # Peak split into parts. peak_memory_bytes is the CUDA allocator peak, or on CPU weights + peak RSS
    # growth (the post-setup baseline already holds the weights, so growth alone would miss them).
    # other_peak_bytes = peak - weights - grads - state: activations, temporaries, allocator slack.
    peak_memory_bytes: int | None = None
    other_peak_bytes: int | None = None
    # time
    first_step_s: float | None = None
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
    # peak memory is inflated: `fidelity` marks such records for the report.
    fidelity: bool = False
    update_cosine_median: float | None = None
    update_rel_error_median: float | None = None
    update_cosine_curve: list[float | None] = field(default_factory=list)
    update_rel_error_curve: list[float | None] = field(default_factory=list)
    # how it ran (engine x parallel mode x precision); see DESIGN.md "Growing the design"
    pretrained: bool | None = None  # False: the model started from random init (training from scratch)
    stage: str | None = None  # "tune" (scored on the validation split) | "final" | None (plain `run`)
    engine: str = "native"  # native | trainer | accelerate
    parallel: str = "none"  # none | ddp | zero1 | fsdp2
    world_size: int = 1
    per_rank: list[dict[str, Any]] = field(default_factory=list)  # each rank's state/memory/time figures
    precision: str = "fp32"  # fp32 | bf16-autocast | fp16-autocast | bf16 (bf16 weights, no fp32 master)
    param_dtype: str = "float32"
    autocast_dtype: str | None = None
    # optimizer-side measurements beyond bytes
    fp32_state_fraction: float | None = None  # share of parameters whose state stays full precision
    optimizer_step_traffic_bytes: int | None = None  # bytes one step must read + write (analytic)
    device_copy_bandwidth_bytes_per_s: float | None = None  # measured once per trial, large tensor copy
    roofline_fraction: float | None = None  # traffic / optimizer-step median / copy bandwidth
    paged: bool | None = None  # None: not a paged optimizer; False: asked for paging, fell back (why in paged_reason)
    paged_reason: str | None = None
    # per-step samples after warm-up (seconds), so `compare` can test against the distribution
    step_time_samples_s: list[float] = field(default_factory=list)
    optimizer_step_samples_s: list[float] = field(default_factory=list)
    # workload metrics: eval_metrics on the eval split; val_metrics on the validation split carved from
    # the training data (tune stage). target_metric names the workload's headline metric in those dicts,
    # target_mode says whether larger ("max") or smaller ("min") is better.
    eval_metrics: dict[str, float] = field(default_factory=dict)
    val_metrics: dict[str, float] = field(default_factory=dict)
    val_metric: float | None = None  # val_metrics[target_metric]
    val_accuracy: float | None = None  # val_metrics["accuracy"] where the workload has one
    target_metric: str = "accuracy"
    target_mode: str = "max"
    eval_curve: list[list[float]] = field(default_factory=list)  # [step, training seconds, target metric]
    target_value: float | None = None  # the threshold time-to-target was measured against
    steps_to_target: int | None = None
    time_to_target_s: float | None = None
    # bookkeeping
    startup_s: float | None = None  # trial launch to the child's first line of real work (imports, fork)
    wall_s: float | None = None
    started_at: str = ""
    env: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe data; a non-finite float (a diverged loss) becomes None."""
        return _finite(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Record:
        """Read a record, keeping unknown (newer) fields out and filling missing (older) ones."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def split_peak_memory(record: Record) -> None:
    """Fill `peak_memory_bytes` and `other_peak_bytes` from the measured peaks.

    On CUDA the allocator's peak counts every live tensor, weights included. On CPU the RSS peak is read
    as growth over the post-setup baseline, which already holds the weights, so they are added back.
    What is left after weights, grads and optimizer state is activations and temporaries ("other").
    On CPU that remainder can come out negative: the baseline is taken after a warm-up backward whose
    freed buffers the allocator may keep resident and reuse (so grads or state need no new pages), and
    RSS counts pages rather than tensors. A negative remainder means "no measurable extra", so it is
    clamped at 0 rather than reported as memory given back.

    Only fields the record lacks are filled, so the report can call this on any record it reads.
    """
    if record.peak_memory_bytes is None:
        if record.peak_cuda_allocated_bytes is not None:
            record.peak_memory_bytes = record.peak_cuda_allocated_bytes
        elif record.peak_rss_growth_bytes is not None and record.weights_bytes is not None:
            record.peak_memory_bytes = record.weights_bytes + record.peak_rss_growth_bytes
    if record.other_peak_bytes is not None or record.peak_memory_bytes is None or None in (
            record.weights_bytes, record.grads_bytes, record.state_bytes):
        return
    other = record.peak_memory_bytes - record.weights_bytes - record.grads_bytes - record.state_bytes
    record.other_peak_bytes = max(0, other)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def append_record(path: Path, record: Record) -> None:
    """Append one record as one line, under an exclusive lock, fsynced before returning.

    The lock (flock on the file itself) lets several sweeps, `--jobs` workers or executor callbacks
    share one results file without interleaving their lines. A file left without a final newline (a
    writer killed mid-line) gets one first, so the torn fragment stays on a line of its own. A write
    that fails half-way (disk full) is cut back to where it started, so the fragment cannot corrupt
    the next append; the error still propagates, since the record was not stored.
    """
    data = (json.dumps(record.to_dict(), allow_nan=False, default=str) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:  # read too: the last byte says whether a newline is missing
        fd = handle.fileno()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            start = os.lseek(fd, 0, os.SEEK_END)
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


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is out (a single write may be partial on a nearly full disk)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class ResultsFileError(ValueError):
    """A results file that is missing or holds something other than records."""


def read_records(path: Path) -> list[Record]:
    """Every record in a JSON Lines file.

    Unreadable lines (a torn write, a line corrupted by hand) are skipped with one warning naming
    their line numbers, so one bad line never hides the rest of a sweep. A file with no readable
    record at all is refused: it is not a results file.
    """
    if not path.is_file():
        raise ResultsFileError(f"no such results file: {path}")
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    bad: list[int] = []
    first_error = ""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            bad.append(number)
            first_error = first_error or f"{path}:{number}: not a JSON line ({exc.msg})"
            continue
        if not isinstance(data, dict) or "trial_id" not in data or "optimizer" not in data:
            raise ResultsFileError(f"{path}:{number}: not an optbench record (no trial_id/optimizer)")
        records.append(Record.from_dict(data))
    if bad and not records:
        raise ResultsFileError(first_error)
    if bad == [len(lines)]:
        warnings.warn(f"{path}:{len(lines)}: skipping a torn last line (sweep killed mid-write?)", stacklevel=2)
    elif bad:
        warnings.warn(f"{path}: skipping {len(bad)} unreadable line(s): {', '.join(map(str, bad))} "
                      "(torn or corrupted writes)", stacklevel=2)
    return records


def completed_trial_ids(path: Path) -> set[str]:
    """Trial ids already recorded `ok` in `path`: a re-run skips these (resume)."""
    if not path.is_file():
        return set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {r.trial_id for r in read_records(path) if r.status == "ok"}


def check_writable(path: Path) -> None:
    """Fail fast (OSError) when records could not be appended to `path`: before any trial runs, not after.

    Creates the folder if missing; opens the file for appending (as the store will) and removes it
    again if this check created it, so a refused run leaves nothing behind.
    """
    if path.exists() and not path.is_file():
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a results file", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = path.exists()
    with open(path, "ab"):
        pass
    if not existed:
        path.unlink()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty off Linux), read once per process."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_name() -> str:
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_model() -> str | None:
    """Family, model and stepping: virtual machines often show every EPYC or Xeon under one bare brand name,
    while these numbers still tell one CPU generation from another."""
    info = _cpuinfo()
    if "cpu family" not in info:
        return None
    return f"family {info['cpu family']} model {info.get('model', '?')} stepping {info.get('stepping', '?')}"


def load_average_1m() -> float | None:
    """The 1-minute load average when the stamp was taken: above the core count, neighbours shared the CPUs
    and every time measured then carries their work."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def environment(packages: Iterable[str] = ("torch", "transformers", "datasets", "bitsandbytes",
                                          "torchao", "optbench")) -> dict[str, Any]:
    """Library versions, hardware and git commit: what a reader needs to trust or reproduce a number."""
    import torch

    env: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform()}
    env.update({name: _version(name) for name in packages})
    env["cuda"] = torch.version.cuda
    env["cpu"] = cpu_name()
    env["cpu_model"] = cpu_model()
    env["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    env["cpu_count"] = os.cpu_count()
    env["load_avg_1m"] = load_average_1m()
    env["torch_threads"] = torch.get_num_threads()
    env["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    env["git_commit"] = _git_commit()
    return env
