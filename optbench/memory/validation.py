"""The peak predictor against measured peaks: which records can speak to it (`unusable_reason`: an ok trial of the
plain loop whose peak holds nothing the predictor leaves out), the table of predicted against measured peaks per
record (`validation_table`), the held-out error band it sums up to (`error_band`) and its markdown. A record that
cannot be used is left out loudly: one LeftOutWarning counting each reason, and the band's page says so too.
optbench/memory/calibrate.py fits the calibration and runs the whole validation.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections import Counter
from collections.abc import Iterable
from typing import Any

from optbench.job.devices import device_kind
from optbench.memory import predict
from optbench.memory.calibration import Calibration, CalibrationError, CalibrationSet, ErrorBand, load_calibrations
from optbench.optimizers import UnknownOptimizerError, resolve
from optbench.records.peaks import split_peak_memory
from optbench.records.record import MIB, Record


class LeftOutWarning(UserWarning):
    """Records a fit or a band could not use: one warning per use, counting each reason."""


def measured_peak(record: Record) -> int | None:
    """The figure the predictor targets: peak_memory_bytes on CPU (weights + peak RSS growth), the CUDA
    allocator's peak on CUDA."""
    split_peak_memory(record)
    return record.peak_cuda_allocated_bytes if device_kind(record.device) == "cuda" else record.peak_memory_bytes


def unusable_reason(record: Record) -> str | None:
    """Why a record cannot calibrate nor validate the predictor; None for an ok single-process trial of the plain
    loop whose peak holds nothing the predictor leaves out (a shadow optimizer, a checkpoint, evaluations)."""
    reasons = ((record.status != "ok", f"status {record.status}"),
               (record.parallel != "none", "a parallel trial (per-rank peaks)"),
               (record.fidelity, "--fidelity (a shadow AdamW in the peak)"),
               (record.resume_check, "--resume-check (a checkpoint in the peak)"),
               (bool(record.eval_curve), "--eval-every (evaluations inside the memory window)"),
               (measured_peak(record) is None, "no measured peak"))
    return next((reason for failed, reason in reasons if failed), None) or _unbuildable(record)


def _unbuildable(record: Record) -> str | None:
    """Why the record's model cannot be built on the meta device here (its workload's earlier default model, whose
    name no longer is a default, or a model neither local nor in the local cache); None when it can."""
    from optbench.workloads import WorkloadError

    try:
        predict.facts_for_spec(spec_for(record))
    except WorkloadError:
        return "a model that cannot be built here (an earlier design of the workload's, or not on this machine)"
    return None


def usable(record: Record) -> bool:
    return unusable_reason(record) is None


def warn_left_out(left_out: Counter, total: int, purpose: str) -> None:
    """One warning naming how many records `purpose` left out, and why (nothing when none was)."""
    if left_out:
        warnings.warn(f"{purpose}: left out {sum(left_out.values())} of {total} records: {describe_left_out(left_out)}",
                      LeftOutWarning, stacklevel=3)


def describe_left_out(left_out: Counter) -> str:
    return "; ".join(f"{count} {reason}" for reason, count in left_out.most_common())


def spec_for(record: Record) -> Any:
    """The trial spec the predictor needs from a record: workload, model, options, dataset, the job's sizes."""
    from optbench.job.spec import TrialSpec
    from optbench.workloads import get_workload

    spec = TrialSpec(optimizer=record.optimizer, workload=record.workload, dataset=None,
                     workload_options=dict(record.workload_options), batch_size=record.batch_size,
                     seq_len=record.seq_len, precision=record.precision, optimizer_kwargs=dict(record.optimizer_kwargs))
    if record.model != get_workload(record.workload).model_name(spec):
        spec = dataclasses.replace(spec, model=record.model)  # a `--model` run: the record names its source
    return spec


def validation_table(records: Iterable[Record], calibrations: CalibrationSet | None = None,
                     purpose: str = "predictor validation") -> Any:
    """Predicted against measured peak per usable record (a pandas DataFrame): the relative error
    (predicted - measured) / measured, whether the trial was held out (not calibrated on), and the error the
    uncalibrated predictor would make without this model's calibration (borrowing the other models' figures).
    The records it cannot use are left out with one LeftOutWarning; `table.attrs["left_out"]` counts the reasons."""
    import pandas as pd

    from optbench.workloads import WorkloadError

    records = list(records)
    rows, left_out = [], Counter()
    for record in records:
        reason = unusable_reason(record)
        if reason is not None:
            left_out[reason] += 1
            continue
        kind = device_kind(record.device)
        found = calibrations if calibrations is not None and calibrations.device_kind == kind else \
            load_calibrations(kind)
        calibration = found.models.get(record.model)
        try:
            with_own, without = (predicted(record, kind, c, found) for c in (calibration, None))
        except (UnknownOptimizerError, predict.PredictError, WorkloadError) as exc:
            left_out[f"the predictor cannot model ({type(exc).__name__})"] += 1
            continue
        rows.append(_validation_row(record, kind, with_own, without, calibration))
    warn_left_out(left_out, len(records), purpose)
    table = pd.DataFrame(rows)
    table.attrs["left_out"] = left_out
    return table


def _validation_row(record: Record, kind: str, with_own: predict.Prediction, without: predict.Prediction,
                    calibration: Calibration | None) -> dict[str, Any]:
    measured = measured_peak(record)
    return {"trial_id": record.trial_id, "workload": record.workload, "model": record.model,
            "optimizer": record.optimizer, "precision": record.precision, "batch_size": record.batch_size,
            "seq_len": record.seq_len, "device": kind, "measured_mib": measured / MIB,
            "predicted_mib": with_own.total_bytes / MIB,
            "error_pct": 100 * (with_own.total_bytes - measured) / measured, "phase": with_own.phase,
            "calibrated": with_own.calibrated,
            "held_out": calibration is None or record.trial_id not in calibration.trial_ids,
            "uncalibrated_error_pct": 100 * (without.total_bytes - measured) / measured}


def predicted(record: Record, kind: str, calibration: Calibration | None,
               calibrations: CalibrationSet) -> predict.Prediction:
    facts = predict.facts_for_spec(spec_for(record))
    return predict.predict_peak(facts, resolve(record.optimizer), record.optimizer_kwargs,
                                batch_size=record.batch_size, seq_len=record.seq_len, precision=record.precision,
                                device_kind=kind, calibration=calibration, borrow_from=calibrations)


def error_band(table: Any, device: str = "cpu", table_path: str = "", calibrated: bool = True) -> ErrorBand:
    """The held-out rows' median and worst |error|, the worst under-prediction and the share under; of the
    predictor as calibrated, or (`calibrated=False`) of the uncalibrated one each model would get without
    its own calibration."""
    held = table[(table["held_out"]) & (table["device"] == device)] if "held_out" in table else table  # none usable
    if held.empty:
        raise CalibrationError(f"no held-out {device} trial to measure the predictor's error on")
    errors = held["error_pct" if calibrated else "uncalibrated_error_pct"] / 100
    over_prediction = -errors / (1 + errors)  # measured / predicted - 1: how far above the prediction a trial went
    over_mib = -errors * held["measured_mib"]  # measured - predicted
    return ErrorBand(device_kind=device, trials=len(held), median_abs_error=float(errors.abs().median()),
                     worst_abs_error=float(errors.abs().max()), worst_under=float(max(over_prediction.max(), 0.0)),
                     share_under=float((errors < 0).mean()), table=table_path, calibrated=calibrated,
                     worst_under_bytes=max(math.ceil(over_mib.max() * MIB), 0))


_COLUMNS = {"source": "file", "workload": "workload", "optimizer": "optimizer", "precision": "precision",
            "batch_size": "batch", "seq_len": "seq", "measured_mib": "measured MiB", "predicted_mib": "predicted MiB",
            "error_pct": "error %", "phase": "peak phase", "uncalibrated_error_pct": "uncalibrated error %",
            "trial_id": "trial_id"}


def render_table(table: Any, title: str, band: ErrorBand | None = None, uncalibrated: ErrorBand | None = None,
                 left_out: Counter | None = None) -> str:
    """A markdown table of predicted vs measured peaks, with the bands' summaries (and what they left out) above."""
    columns = [c for c in _COLUMNS if c in table.columns]
    shown = table.sort_values(["workload", "optimizer", "batch_size", "seq_len"])[columns].rename(columns=_COLUMNS)
    lines = [f"# {title}", ""]
    lines += [b.describe() + "  " for b in (band, uncalibrated) if b is not None]
    if left_out:
        lines.append(f"left out of the band: {describe_left_out(left_out)}  ")
    if band is not None:
        lines += ["",
                  "error = (predicted - measured) / measured of peak_memory_bytes (CPU: weights + peak RSS "
                  "growth); under-predicted rows have a negative error. Uncalibrated: what the predictor says "
                  "without the model's own calibration (analytic activations scaled like the other calibrated "
                  "models', their retained share and overhead)", ""]
    lines.append(shown.to_markdown(index=False, floatfmt=".1f"))
    return "\n".join(lines) + "\n"
