"""Filling a record from what was trained and measured, written once: the trial (run.py) and the HF Trainer
callback (callback.py) both describe through these, so a user's own Trainer run and an optbench trial carry the
same figures, computed the same way.

`describe_model` before training (sizes and what the entry's state *should* hold); `describe_training` after it,
from the engine's result (peaks, the state the optimizer really holds, step samples, the fidelity probe): the one
place each of those fields is set; `describe_bandwidth` once the device's bandwidth was sampled around training
(with the roofline, which needs both).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbench.probes import bandwidth, measure
from optbench.records.peaks import split_peak_memory
from optbench.records.record import Record

if TYPE_CHECKING:
    import torch

    from optbench.optimizers import OptimizerSpec
    from optbench.probes.bandwidth import BandwidthCalibration
    from optbench.trial.engines.base import EngineResult


def describe_model(record: Record, model: torch.nn.Module, entry: OptimizerSpec | None) -> None:
    """Parameter count, weight and gradient bytes, and (with a registry `entry`) what its state *should* hold."""
    from optbench.optimizers import factored_numel, state_precision

    params = [p for p in model.parameters() if p.requires_grad]
    record.num_params = sum(p.numel() for p in params)
    record.weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    record.grads_bytes = sum(p.numel() * p.element_size() for p in params)
    record.factored_numel = factored_numel([tuple(p.shape) for p in params])
    if entry is None or not record.num_params:
        return
    facts = entry.analytic_for(model, **record.optimizer_kwargs)  # kwargs such as rank change the count
    record.state_precision = state_precision(record.state_precision or entry.precision,
                                             str(params[0].dtype) == "torch.bfloat16", facts.fp32_state_numel)
    record.analytic_state_bytes = facts.state_bytes
    record.analytic_state_bytes_per_param = facts.state_bytes / record.num_params
    record.fp32_state_fraction = facts.fp32_state_numel / record.num_params
    record.optimizer_step_traffic_bytes = facts.step_traffic_bytes


def describe_state(record: Record, optimizer: torch.optim.Optimizer, entry: OptimizerSpec | None,
                   model: torch.nn.Module | None = None, state_map_dir: str | None = None) -> None:
    """The state the optimizer really holds after training (it is created lazily on the first step), and where it
    sits: per module kind on the record, the full per-parameter map as a CSV in `state_map_dir` when asked; the
    part of it in paged (unified) memory, which no allocator peak sees."""
    from optbench.memory import statemap

    record.state_bytes, record.state_bytes_by_key = measure.optimizer_state_bytes(optimizer)
    record.paged_state_bytes = measure.paged_state_bytes(optimizer)
    if model is not None:
        rows = statemap.measured_state_map(optimizer, model)
        record.state_bytes_by_module = statemap.bytes_by_module(rows)
        if state_map_dir:
            import torch.distributed

            rank = f"-rank{torch.distributed.get_rank()}" if record.parallel not in (None, "none") else ""
            statemap.write_state_map(rows, Path(state_map_dir) / f"{record.optimizer}-seed{record.seed}-"
                                                                  f"{record.trial_id}{rank}.csv")
    if record.num_params:
        record.state_bytes_per_param = record.state_bytes / record.num_params
    if entry is not None:
        record.paged, record.paged_reason = entry.paging(optimizer)
    record.optimizer_impl = measure.optimizer_impl(optimizer)


def describe_training(record: Record, result: EngineResult, optimizer: Any, entry: OptimizerSpec | None,
                      model: torch.nn.Module | None, state_map_dir: str | None = None) -> None:
    """Everything the engine measured, onto the record, once: the memory window's peaks (and what training held
    after its last step), the optimizer's state, the peak split into parts, the first step, the skipped steps and
    the speed figures, the update-fidelity curves."""
    if result.memory is not None:
        result.memory.fill(record)
    if optimizer is not None:
        describe_state(record, optimizer, entry, model, state_map_dir)
    split_peak_memory(record)
    result.samples.fill(record)
    measure.describe_speed(record, result.samples.step_times, result.samples.optimizer_times)
    if result.fidelity is not None:
        from optbench.probes.fidelity import median_of

        record.update_cosine_curve, record.update_rel_error_curve = result.fidelity.cosines, result.fidelity.rel_errors
        record.update_cosine_median = median_of(result.fidelity.cosines)
        record.update_rel_error_median = median_of(result.fidelity.rel_errors)
    if result.paired is not None:
        record.paired_probe_bytes_per_s, record.paired_roofline_fraction = result.paired.paired(
            result.samples, record.optimizer_step_traffic_bytes)


def describe_final_loss(record: Record) -> None:
    """The final training loss: the mean of the last five logged losses (one step's loss is noisy)."""
    tail = record.loss_curve[-5:]
    record.train_loss_final = sum(tail) / len(tail) if tail else None


def step_working_set_bytes(record: Record) -> int | None:
    """What an optimizer step streams through: the weights, the gradients and the state (the analytic count before
    training has measured it; None where a part is unknown)."""
    state = record.state_bytes if record.state_bytes is not None else record.analytic_state_bytes
    parts = (record.weights_bytes, record.grads_bytes, state)
    return None if None in parts else sum(parts)  # type: ignore[arg-type]


def describe_bandwidth(record: Record, samples: list[float], calibration: BandwidthCalibration | None,
                       source: str) -> None:
    """The bandwidth figures (the trial's own probe samples taken around training, the machine's calibrated ceiling
    and where it came from: optbench/probes/bandwidth.py) and the roofline share: the optimizer step's analytic
    traffic over its median time, against the calibrated ceiling of the step's working set only (none without a
    calibration: a ceiling sampled during one trial on a shared machine is noise). A ratio above 1 is a step that
    outran its ceiling, a failed calibration for this trial rather than a roofline: it is kept as
    `ceiling_outrun_fraction`, and `roofline_fraction` stays none."""
    bandwidth.describe_bandwidth(record, samples, calibration, source, step_working_set_bytes(record))
    ceiling = record.device_bandwidth_calibrated_bytes_per_s
    if record.optimizer_step_median_s and ceiling and record.optimizer_step_traffic_bytes:
        ratio = record.optimizer_step_traffic_bytes / record.optimizer_step_median_s / ceiling
        if ratio > 1:
            record.ceiling_outrun_fraction = ratio
        else:
            record.roofline_fraction = ratio
