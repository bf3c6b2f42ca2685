"""One trial, in this process: set up the workload and optimizer, train under an engine, measure, evaluate.

`run_trial(spec) -> Record` starts no process. The process layer (optbench/sweep/) runs it in a fresh child
per trial, so peak memory starts from a clean slate and a crash takes only that trial down; tests and the
benchmark suite call it directly. A parallel trial (`spec.parallel != "none"`) runs only inside a torchrun
rank, which the process layer starts.

The trial reads top to bottom: `setup` (device, workload, precision, optimizer, schedule), `describe_model`
(sizes and the analytic state count), the device bandwidth before training, the engine's timed loop
(engines/), `describe_training` (state, memory and speed from what the engine returns, trial/describe.py),
the bandwidth again, the engine's resume check if asked, then `evaluate_final`.
Timing discipline lives in the engine: the first optimizer step (lazy state creation, compilation) is
reported apart as `first_step_s`, the medians cover the steps after `warmup_steps`, probes and evaluations sit
outside the timed intervals and outside the memory window.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import random
import time
import warnings
from collections.abc import Iterator

import torch

from optbench.job.devices import GPU_PINNED_ENV, resolve_device
from optbench.job.spec import TrialSpec
from optbench.optimizers import resolve
from optbench.optimizers.base import dtype_name
from optbench.probes import bandwidth, measure, stream
from optbench.records.environment import cpu_name, environment, machine_key, names_cuda
from optbench.records.oom import out_of_memory_cause, under_cap
from optbench.records.record import Record
from optbench.trial.describe import (
    describe_bandwidth,
    describe_final_loss,
    describe_model,
    describe_training,
    step_working_set_bytes,
)
from optbench.trial.engines import Diverged, Setup, engine_for, evaluate
from optbench.trial.precision import parse_precision
from optbench.trial.settings import settings_record

DIVERGENCE_FACTOR = 3.0  # final loss this many times the first loss (or the chance loss) → diverged
BANDWIDTH_SAMPLES = 5  # probe passes before and again after training: a check on the calibrated ceiling


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def setup(spec: TrialSpec, record: Record) -> Setup:
    """Device, workload, model in the spec's precision, optimizer and schedule: no step taken yet."""
    from optbench.workloads import get_workload

    device = resolve_device(spec.device)
    if device.type == "cuda":
        # "cuda" then means this GPU everywhere: CUDA events, streams and libraries follow the current device
        torch.cuda.set_device(device)
    pinned = bool(os.environ.get(GPU_PINNED_ENV)) and names_cuda(spec.device)
    record.device = spec.device if pinned else str(device)  # the user's cuda:N, not the pinned process's cuda:0
    record.device_name, record.env = device_name(device), environment(device)
    precision = parse_precision(spec.precision)
    record.param_dtype = dtype_name(precision.param_dtype)
    record.autocast_dtype = dtype_name(precision.autocast_dtype) if precision.autocast_dtype is not None else None
    entry = resolve(spec.optimizer)
    random.seed(spec.seed)
    workload = get_workload(spec.workload)
    built = workload.build(spec)
    record.model, record.dataset, record.pretrained = built.model_name, built.dataset_name, built.pretrained
    record.val_rows = None if built.val is None else next(iter(built.val.values())).shape[0]
    record.eval_rows = None if built.eval is None else next(iter(built.eval.values())).shape[0]
    record.metric_ceiling, record.metric_chance = built.metric_ceiling, built.metric_chance
    record.val_chance = built.val_chance
    model = built.model.to(device=device, dtype=precision.param_dtype)
    model.train()
    s = Setup(spec=spec, device=device, precision=precision, workload=workload, built=built, model=model,
              entry=entry, scaler=precision.grad_scaler(device),
              params=[p for p in model.parameters() if p.requires_grad])
    s.install_optimizer(lambda: entry.build_for(model, lr=record.lr, **spec.optimizer_kwargs))
    return s


def evaluate_final(s: Setup, record: Record) -> None:
    """Every split the trial built: validation (study trials: it picks the lr) and eval (what is reported)."""
    if s.built.val is not None:
        record.val_metrics = evaluate(s, s.built.val)
        record.val_metric = record.val_metrics.get(record.target_metric)
        record.val_accuracy = record.val_metrics.get("accuracy")
    if s.built.eval is not None:
        record.eval_metrics = evaluate(s, s.built.eval)
        record.eval_accuracy = record.eval_metrics.get("accuracy")
        record.eval_f1 = record.eval_metrics.get("f1")


def time_to_target(record: Record, target: float) -> None:
    """Steps and training seconds to where the eval curve reaches `target`, interpolated between the evaluations
    around it as the report reads it (report/stats.reached; None when never reached)."""
    from optbench.report.stats import reached

    record.target_value = target
    hit = reached(record.eval_curve, target, record.target_mode)
    if hit is not None:
        record.steps_to_target, record.time_to_target_s = round(hit.step), hit.seconds


def check_divergence(record: Record, chance_loss: float) -> None:
    losses = record.loss_curve
    describe_final_loss(record)
    if record.train_loss_final > DIVERGENCE_FACTOR * max(losses[0], chance_loss):
        raise Diverged(f"final train loss {record.train_loss_final:.3g} is over {DIVERGENCE_FACTOR:g}x "
                       f"the first ({losses[0]:.3g})")


def run_trial(spec: TrialSpec) -> Record:
    """Run one trial to a record in this process; failures become a status, never an exception."""
    record = settings_record(spec)
    start = time.perf_counter()
    try:
        if spec.parallel != "none" and not torch.distributed.is_initialized():
            raise RuntimeError(f"--parallel {spec.parallel} trials run in a torchrun group: run them through the "
                               "sweep (optbench.sweep.run_sweep) or LocalExecutor, not run_trial")
        with measurement_warnings(record):
            _train_and_measure(spec, record)
        record.status = "ok"
    except Diverged as exc:
        record.status, record.error = "diverged", str(exc)
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, the sweep goes on
        oom = out_of_memory_cause(exc)
        record.status = "oom" if oom is not None else "error"
        shown = exc if oom is None else oom  # the refused allocation, not a library's rewording of it
        record.error = f"{type(shown).__name__}: {shown}"
        if record.status == "oom":
            record.error = under_cap(record.error, spec.max_memory_bytes)
    record.wall_s = time.perf_counter() - start
    return record


@contextlib.contextmanager
def measurement_warnings(record: Record) -> Iterator[None]:
    """Keep what the probes warned about on the record (each message once), where the sweep that runs the trial
    in a child process can say it; every other warning is shown as usual."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", measure.MeasurementWarning)
            yield
    finally:  # outside the catching block: a warning shown again here must not be caught again
        for found in caught:
            if issubclass(found.category, measure.MeasurementWarning):
                record.measurement_warnings = list(dict.fromkeys([*record.measurement_warnings, str(found.message)]))
            else:
                warnings.showwarning(found.message, found.category, found.filename, found.lineno)


def _train_and_measure(spec: TrialSpec, record: Record) -> None:
    from optbench.memory.predict import for_trial

    s = setup(spec, record)
    describe_model(record, s.model, s.entry)
    record.predicted_peak_bytes = for_trial(spec, s.model, s.entry, str(s.device))  # before a step: a prediction
    calibration, source = bandwidth.load_for(machine_key(s.device))  # the roofline's ceiling, measured once
    probe = bandwidth_probe(s, record, calibration)
    result = engine_for(spec)(s, record)
    describe_training(record, result, s.optimizer, s.entry, s.model, spec.state_map_dir)
    describe_bandwidth(record, probe + bandwidth_probe(s, record, calibration), calibration, source)
    if spec.parallel != "none" and spec.state_map_dir:
        check_sharding(s, record)
    if spec.target is not None:
        time_to_target(record, spec.target)
    if result.resume is not None:  # the engine's own check (--resume-check): resume fresh objects, compare
        result.resume.finish(fresh_setup(spec, record))
    evaluate_final(s, record)
    check_divergence(record, s.built.chance_loss)


def bandwidth_probe(s: Setup, record: Record, calibration: bandwidth.BandwidthCalibration | None) -> list[float]:
    """The trial's own probe passes (probes/stream.py), over the calibrated level of its step's working set (a
    check on the ceiling its roofline divides by: probes/bandwidth.py); taken before and again after training."""
    operand = bandwidth.probe_operand_bytes(s.device, step_working_set_bytes(record), calibration)
    record.device_bandwidth_probe_working_set_bytes = stream.OPERANDS * operand
    return stream.stream_bandwidth_samples(s.device, BANDWIDTH_SAMPLES, operand)


def check_sharding(s: Setup, record: Record) -> None:
    """`--state-map` under a parallel mode (memory/sharding.py): every rank's measured state map goes to rank 0, which
    builds one process of the same job, steps it once (after this rank's memory window has closed) and records each
    parameter whose state precision or bytes per element differ."""
    from optbench.memory import sharding, statemap
    from optbench.trial.engines.loop import timed_steps
    from optbench.trial.engines.parallel import gather_to_rank0

    ranks = gather_to_rank0(sharding.local_rows(statemap.measured_state_map(s.optimizer, s.model), s.model))
    if ranks is None:
        return
    one = setup(dataclasses.replace(s.spec, parallel="none", nproc=1, state_map_dir=None), copy.copy(record))
    for _ in timed_steps(one, stop=1):
        pass
    single = statemap.measured_state_map(one.optimizer, one.model)
    record.sharding_state_changes = [change.to_dict() for change in sharding.compare(single, ranks)]
    record.sharding_checked_params = sum(1 for row in single if row.module_kind != statemap.SHARED)


def fresh_setup(spec: TrialSpec, record: Record) -> Setup:
    """New model, optimizer and schedule from the same spec (what a resumed job builds before loading), wrapped
    for the parallel mode like the trial's own; the trial's record is left as it is."""
    scratch = copy.copy(record)
    s = setup(spec, scratch)
    if spec.parallel != "none":
        from optbench.trial.engines.parallel import prepare

        prepare(s, scratch)
    return s
