"""The one metric table: what every report table, `compare`, `recommend`, the side-by-side table, the
terminal summary and the HTML page show, and how each is read.

Each `Metric` says: how its value comes from a Record (`value`), the frame column it lands in, the title
and unit of its table column, its decimals, its direction (lower or higher is better; "target" for the
job's own target metric, whose direction is `record.target_mode`), which gate `compare` applies (time,
memory, quality or none) and, for times, the Record field holding the per-step samples that gate tests.
Adding a column that compare also gates is one entry here plus the Record field.

The quality metric is the workload's target metric (`record.target_metric` in `eval_metrics`): accuracy
for the classifiers, perplexity for the `lm` workload.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from optbench.probes import steady_calibration
from optbench.records.peaks import held_bytes, on_cuda, train_memory_bytes
from optbench.records.record import MIB, Record
from optbench.records.text import clip

LOWER, HIGHER, TARGET = "lower", "higher", "target"  # directions; TARGET: the record's target_mode decides
TIME, MEMORY, QUALITY = "time", "memory", "quality"  # compare's gate checks
MEAN, MEDIAN_INF, TEXT = "mean", "median-inf", "text"  # how seeds are summarised


@dataclass(frozen=True)
class Metric:
    column: str  # in the per-trial and summary frames
    title: str  # table header; "{metric}" stands for the job's target metric
    unit: str
    decimals: int
    direction: str | None  # LOWER | HIGHER | TARGET | None (descriptive)
    value: Callable[[Record], Any] | None  # None: derived over the whole job (time to target)
    gate: str | None = None  # TIME | MEMORY | QUALITY | None
    samples: str | None = None  # TIME: the Record field with the per-step samples (seconds)
    label: str = ""  # compare's name for it ("step time"); defaults to the title
    aggregate: str = MEAN
    show: bool = True  # False: summarised for the figures, not a table column
    compact: bool = False  # in the terminal's compact table and the side-by-side table
    peak_floor: bool = False  # MEMORY: a CPU peak must also clear Thresholds.min_peak_growth_mib
    hide_for_target: str | None = None  # not shown when the job's target metric is this (a duplicate column)
    invalid_above: float | None = None  # a value above this is a measurement failure, never a result
    invalid_text: str = ""
    scored: bool = False  # a score of the model's predictions: `untrained` where the job did not train (bounds.py)
    adjust_for: str | None = None  # TIME: the column of a per-process time this metric's change cannot move, whose
    # spread between processes compare regresses out (report/noise.py, `adjusted`)

    def name(self, metric: str = "accuracy") -> str:
        return (self.label or self.title).format(metric=metric)

    def higher_is_better(self, target_mode: str = "max") -> bool | None:
        if self.direction == TARGET:
            return target_mode == "max"
        return None if self.direction is None else self.direction == HIGHER


def _scaled(field: str, factor: float) -> Callable[[Record], float | None]:
    def value(record: Record) -> float | None:
        raw = getattr(record, field)
        return None if raw is None else raw * factor
    return value


def _text(field: str) -> Callable[[Record], str | None]:
    return lambda record: getattr(record, field) or None


RESUME_CELL_CHARS = 60  # the README's and report's tables stay readable; the errors list under them has it all


def _resume_cell(record: Record) -> str | None:
    """The resume status, a library's long error cut to a table cell (the record keeps all of it)."""
    status = record.resume_status
    return clip(status, RESUME_CELL_CHARS) if status else status


def _scientific(field: str) -> Callable[[Record], str | None]:
    """A figure that spans many decades (a parameter difference: 0, 1e-7, 3e-2), shown as 1.2e-05."""
    return lambda record: None if getattr(record, field) is None else f"{getattr(record, field):.1e}"


def _peak_mib(record: Record) -> float | None:
    """The process's peak: CUDA allocated on a GPU, whole RSS on CPU."""
    peak = record.peak_cuda_allocated_bytes if on_cuda(record) else record.peak_rss_bytes
    return None if peak is None else peak / MIB


def _train_mem_mib(record: Record) -> float | None:
    """peaks.train_memory_bytes in MiB."""
    peak = train_memory_bytes(record)
    return None if peak is None else peak / MIB


def _held_mib(record: Record) -> float | None:
    """Held after the last optimizer step (CPU): grads + state + what the allocator keeps."""
    held = held_bytes(record)
    return None if held is None else held / MIB


def eval_target(record: Record) -> float | None:
    """The record's quality figure: eval_metrics[target_metric], or eval_accuracy for older records."""
    metric = record.target_metric or "accuracy"
    if record.eval_metrics.get(metric) is not None:
        return float(record.eval_metrics[metric])
    return record.eval_accuracy if metric == "accuracy" else None


def _matches_analytic(record: Record) -> str | None:
    """yes / no: the measured state equals the registry's analytic count byte for byte."""
    if record.state_bytes is None or record.analytic_state_bytes is None:
        return None
    return "yes" if record.state_bytes == record.analytic_state_bytes else "no"


def _roofline_pct(record: Record) -> float | None:
    """The roofline in %, only against a steady calibrated ceiling: a record without one (or from before
    calibrations, which divided by its own per-trial probe, or stamped with an unsteady calibration) has none. A step
    that outran its ceiling reads its ratio (above 100 %), which the column's `invalid_above` shows as a failed
    calibration, never as a figure."""
    outran = record.ceiling_outrun_fraction
    return _pct_of_steady_ceiling(record, record.roofline_fraction if outran is None else outran)


def triad_roofline_pct(record: Record) -> float | None:
    """What a record from before the stream kernel read over a steady triad calibration, in %: no roofline (the step
    outstreams a triad), so no table shows it; the README's history of those sets quotes it as what they read."""
    return _pct_of_steady_ceiling(record, record.triad_roofline_fraction)


def _pct_of_steady_ceiling(record: Record, fraction: float | None) -> float | None:
    if fraction is None or not _steadily_calibrated(record):
        return None
    return 100 * fraction


def _steadily_calibrated(record: Record) -> bool:
    """A calibrated ceiling measured while the machine held one speed (probes.steady_calibration); records stamped
    before calibrations stored their spread count as steady."""
    ceiling = record.device_bandwidth_calibrated_bytes_per_s
    spread = record.device_bandwidth_calibrated_spread_bytes_per_s
    return bool(ceiling) and (spread is None or steady_calibration(ceiling, spread))


def _ceiling(record: Record) -> str | None:
    """What the roofline was divided by: `calibrated` (and whether the trial's own probe disagreed with it),
    `uncalibrated`, or a triad's calibration (no ceiling); None where the step's traffic is unknown (no roofline to
    speak of)."""
    if record.optimizer_step_traffic_bytes is None:
        return None
    if not record.device_bandwidth_calibrated_bytes_per_s:
        return "uncalibrated"
    if not _steadily_calibrated(record):
        return "unsteady calibration"
    if record.triad_roofline_fraction is not None:
        return "a triad's: no ceiling"  # a record from before the stream kernel (records/upgrade.py, schema 4)
    return "calibrated; probe disagrees" if record.device_bandwidth_probe_disagrees else "calibrated"


def sharding_cell(record: Record) -> str | None:
    """The sharding check (`--state-map` under --parallel): how many parameters' state changed precision or bytes per
    element against one process (optbench.memory.sharding); None where it did not run."""
    changes = record.sharding_state_changes
    if changes is None:
        return None
    precision = sum(change["kind"] == "precision" for change in changes)
    return f"{len(changes)} ({precision} precision)" if changes else "none"


def _rest_of_step_ms(record: Record) -> float | None:
    """The step without optimizer.step() (forward, backward, zero_grad), its median over the timed steps, in ms: a
    time of the same process that a change to the optimizer step cannot move, so it measures the process's own
    speed (report/noise.py's adjustment)."""
    steps, optimizer = record.step_time_samples_s, record.optimizer_step_samples_s
    if steps and len(steps) == len(optimizer):
        return 1e3 * statistics.median(total - own for total, own in zip(steps, optimizer, strict=True))
    if record.step_time_median_s is None or record.optimizer_step_median_s is None:
        return None
    return 1e3 * (record.step_time_median_s - record.optimizer_step_median_s)


def _prediction_error_pct(record: Record) -> float | None:
    """predicted / measured peak - 1, in %: how far optbench.memory.predict was off before training."""
    if not record.predicted_peak_bytes or not record.peak_memory_bytes:
        return None
    return 100 * (record.predicted_peak_bytes / record.peak_memory_bytes - 1)


METRICS: tuple[Metric, ...] = (
    Metric("state_mib", "state MiB", "MiB", 1, LOWER, _scaled("state_bytes", 1 / MIB), MEMORY, label="state",
           compact=True),
    Metric("state_bytes_per_param", "state B/param", "B", 3, LOWER, _scaled("state_bytes_per_param", 1)),
    Metric("state_matches_analytic", "= analytic", "", 0, None, _matches_analytic, aggregate=TEXT),
    Metric("sharding_changes", "state changed sharded", "", 0, None, sharding_cell, aggregate=TEXT),
    Metric("peak_mib", "peak MiB", "MiB", 0, LOWER, _peak_mib),
    Metric("train_mem_mib", "train mem MiB", "MiB", 0, LOWER, _train_mem_mib, MEMORY, label="peak memory",
           compact=True, peak_floor=True),
    Metric("held_mib", "held MiB", "MiB", 0, LOWER, _held_mib),
    # held minus grads and state: allocator-cached activations and temporaries still resident
    Metric("held_other_mib", "held other MiB", "MiB", 0, LOWER, _scaled("held_other_bytes", 1 / MIB)),
    Metric("predicted_peak_mib", "pred. peak MiB", "MiB", 0, None, _scaled("predicted_peak_bytes", 1 / MIB)),
    Metric("peak_prediction_error_pct", "pred. err %", "%", 1, None, _prediction_error_pct),
    Metric("step_ms", "step ms", "ms", 1, LOWER, _scaled("step_time_median_s", 1e3), TIME, "step_time_samples_s",
           label="step time", compact=True),
    Metric("opt_step_ms", "opt step ms", "ms", 1, LOWER, _scaled("optimizer_step_median_s", 1e3), TIME,
           "optimizer_step_samples_s", label="optimizer step", compact=True, adjust_for="rest_of_step_ms"),
    Metric("rest_of_step_ms", "rest of step ms", "ms", 1, LOWER, _rest_of_step_ms, label="rest of the step",
           show=False),
    Metric("first_step_s", "first step s", "s", 2, LOWER, _scaled("first_step_s", 1)),  # state creation, compile
    Metric("samples_per_s", "samples/s", "1/s", 1, HIGHER, _scaled("samples_per_s", 1)),
    Metric("fp32_state_pct", "fp32 state %", "%", 2, None, _scaled("fp32_state_fraction", 100)),
    Metric("impl", "impl", "", 0, None, _text("optimizer_impl"), aggregate=TEXT),  # what torch ran
    # optimizer step's memory traffic / its time, as a share of the machine's calibrated bandwidth (only then)
    Metric("roofline_pct", "roofline %", "%", 1, HIGHER, _roofline_pct, invalid_above=100.0,
           invalid_text="calib. fail"),
    # --paired-probe: each step against the stream kernel's pass right after it (probes/paired.py), the trial's median;
    # above 100 % the passes ran slower than the steps they were paired with: a measurement failure, as above
    Metric("paired_roofline_pct", "paired roofline %", "%", 1, HIGHER, _scaled("paired_roofline_fraction", 100),
           invalid_above=100.0, invalid_text="probe fail"),
    Metric("bandwidth_gb_s", "bandwidth GB/s", "GB/s", 1, None,
           _scaled("device_bandwidth_calibrated_bytes_per_s", 1e-9)),  # the calibrated ceiling
    # the working set that ceiling was calibrated at: the largest no larger than the step's weights + grads + state
    Metric("bw_working_set_mib", "bw working set MiB", "MiB", 0, None,
           _scaled("device_bandwidth_working_set_bytes", 1 / MIB)),
    Metric("bw_ceiling", "bw ceiling", "", 0, None, _ceiling, aggregate=TEXT),
    Metric("probe_gb_s", "probe GB/s", "GB/s", 1, None, _scaled("device_bandwidth_bytes_per_s", 1e-9)),  # a check
    Metric("eval_target", "eval {metric}", "", 4, TARGET, eval_target, QUALITY, compact=True, scored=True),
    Metric("steps_to_target", "steps to target", "steps", 0, LOWER, None, aggregate=MEDIAN_INF),
    Metric("time_to_target_s", "time to target s", "s", 1, LOWER, None, aggregate=MEDIAN_INF),
    Metric("eval_accuracy", "eval acc", "", 3, HIGHER, _scaled("eval_accuracy", 1), hide_for_target="accuracy",
           scored=True),
    Metric("eval_f1", "eval F1", "", 3, HIGHER, _scaled("eval_f1", 1), scored=True),
    Metric("update_cosine_median", "update cos", "", 4, HIGHER, _scaled("update_cosine_median", 1)),  # --fidelity
    Metric("ckpt_mib", "ckpt MiB", "MiB", 1, LOWER, _scaled("checkpoint_bytes", 1 / MIB)),
    Metric("ckpt_save_s", "ckpt save s", "s", 2, LOWER, _scaled("checkpoint_save_s", 1)),
    Metric("ckpt_load_s", "ckpt load s", "s", 2, LOWER, _scaled("checkpoint_load_s", 1)),
    Metric("resume", "resume", "", 0, None, _resume_cell, aggregate=TEXT),
    Metric("resume_param_diff", "resume max Δparam", "", 0, None, _scientific("resume_max_abs_param_diff"),
           aggregate=TEXT),
    # for the figures only
    Metric("weights_mib", "weights MiB", "MiB", 1, None, _scaled("weights_bytes", 1 / MIB), show=False),
    Metric("grads_mib", "grads MiB", "MiB", 1, None, _scaled("grads_bytes", 1 / MIB), show=False),
    Metric("peak_memory_mib", "peak memory MiB", "MiB", 0, LOWER, _scaled("peak_memory_bytes", 1 / MIB), show=False),
    Metric("other_peak_mib", "other MiB", "MiB", 0, None, _scaled("other_peak_bytes", 1 / MIB), show=False),
    Metric("update_rel_error_median", "update rel. error", "", 4, LOWER, _scaled("update_rel_error_median", 1),
           show=False),
)
BY_COLUMN = {metric.column: metric for metric in METRICS}
QUALITY_METRIC = BY_COLUMN["eval_target"]
MEMORY_HEADLINE = BY_COLUMN["train_mem_mib"]  # the "mem saved % vs adamw" column
SPEED_HEADLINE = BY_COLUMN["step_ms"]  # the "speed x vs adamw" column


def gated() -> tuple[Metric, ...]:
    """The metrics `compare` tests: every entry with a gate check (read at call time, so one entry is enough)."""
    return tuple(metric for metric in METRICS if metric.gate is not None)


def record_values(record: Record) -> dict[str, Any]:
    """Every record-derived metric of one record, by frame column."""
    return {metric.column: metric.value(record) for metric in METRICS if metric.value is not None}
