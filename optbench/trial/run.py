"""One trial, in this process: set up the workload and optimizer, train under an engine, measure, evaluate.

`run_trial(spec) -> Record` starts no process. The process layer (optbench/sweep/) runs it in a fresh child
per trial, so peak memory starts from a clean slate and a crash takes only that trial down; tests and the
benchmark suite call it directly. A parallel trial (`spec.parallel != "none"`) runs only inside a torchrun
rank, which the process layer starts.

The trial reads top to bottom: `setup` (device, workload, precision, optimizer, schedule), `describe_model`
(sizes and the analytic state count), the device bandwidth before training, the engine's timed loop
(engines/), `describe_state`, the memory and speed figures, the bandwidth again, then `evaluate_final`.
Timing discipline lives in the engine: the first optimizer step (lazy state creation, compilation) is
reported apart as `first_step_s`, the medians cover the steps after `warmup_steps`, probes and evaluations sit
outside the timed intervals and outside the memory window.
"""

from __future__ import annotations

import copy
import os
import random
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from optbench.job.spec import TrialSpec
from optbench.optimizers import OptimizerSpec, resolve
from optbench.probes import measure
from optbench.records.environment import GPU_PINNED_ENV, cpu_name, environment
from optbench.records.record import Record, job_key, split_peak_memory
from optbench.trial.engines import Diverged, Setup, engine_for, evaluate
from optbench.trial.precision import dtype_name, parse_precision
from optbench.trial.schedules import make_scheduler

DIVERGENCE_FACTOR = 3.0  # final loss this many times the first loss (or the chance loss) → diverged
BANDWIDTH_SAMPLES = 5  # triad passes before and again after training: the roofline's ceiling and its spread


def resolve_device(name: str) -> torch.device:
    """The torch device a spec's device name means in this process, always with an index on CUDA (torch's
    set_device and the memory cap want one). Where the process layer pinned the trial's GPU (CUDA_VISIBLE_DEVICES
    holds only it), `cuda:N` is this process's cuda:0; a bare `cuda` is the current GPU (a torchrun rank has set
    its own), asked without initialising CUDA where nothing has yet."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device '{name}'; use auto, cpu, cuda or cuda:N") from None
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise ValueError(f"device '{name}' asked for, but this torch build sees no CUDA device (use --device cpu)")
    if device.index is None:
        return torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_initialized() else 0)
    if os.environ.get(GPU_PINNED_ENV):
        return torch.device("cuda", 0)
    if device.index >= torch.cuda.device_count():
        raise ValueError(f"device '{name}' asked for, but only {torch.cuda.device_count()} GPU(s) are visible")
    return device


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def record_from_spec(spec: TrialSpec) -> Record:
    """A record holding the trial's settings, before anything is measured (a failed trial keeps these)."""
    from optbench.workloads import LR_USER, WorkloadError, get_workload, lr_for

    try:
        entry = resolve(spec.optimizer)
        name, precision, (lr, source) = entry.name, entry.precision, lr_for(spec, entry)
    except (ValueError, WorkloadError):
        name, precision, lr, source = spec.optimizer, "", spec.lr or 0.0, spec.lr_source or LR_USER
    record = Record(
        trial_id=spec.trial_id, optimizer=name, optimizer_kwargs=dict(spec.optimizer_kwargs),
        state_precision=precision, workload=spec.workload, workload_options=dict(spec.workload_options),
        model=spec.model or spec.workload, dataset=spec.dataset or "embedded-reviews", seed=spec.seed,
        device=spec.device, steps=spec.steps, warmup_steps=spec.warmup_steps, batch_size=spec.batch_size,
        seq_len=spec.seq_len, eval_size=spec.eval_size, lr=lr, schedule=spec.schedule, fidelity=spec.fidelity,
        started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), stage=spec.stage, engine=spec.engine,
        parallel=spec.parallel, world_size=spec.nproc, precision=spec.precision, resume_check=spec.resume_check,
    )
    record.lr_source = source
    try:
        workload = get_workload(spec.workload)
        record.target_metric, record.target_mode = workload.target_metric, workload.target_mode
        record.model, record.dataset = workload.model_name(spec), workload.dataset_name(spec)
        record.pretrained = workload.is_pretrained(spec)
    except WorkloadError:
        pass
    # Where it would have run and on what: a failed trial's record still lands in its job (compare, report).
    if spec.device == "auto":
        record.device = "cuda" if torch.cuda.is_available() else "cpu"
    record.job_key = job_key(record)
    record.env = environment(None if record.device.startswith("cuda") else torch.device("cpu"))
    return record


def setup(spec: TrialSpec, record: Record) -> Setup:
    """Device, workload, model in the spec's precision, optimizer and schedule: no step taken yet."""
    from optbench.workloads import get_workload

    device = resolve_device(spec.device)
    if device.type == "cuda":
        # "cuda" then means this GPU everywhere: CUDA events, streams and libraries follow the current device
        torch.cuda.set_device(device)
    pinned = bool(os.environ.get(GPU_PINNED_ENV)) and spec.device.startswith("cuda")
    record.device = spec.device if pinned else str(device)  # the user's cuda:N, not the pinned process's cuda:0
    record.device_name, record.env = device_name(device), environment(device)
    precision = parse_precision(spec.precision)
    record.param_dtype, record.autocast_dtype = dtype_name(precision.param_dtype), dtype_name(precision.autocast_dtype)
    entry = resolve(spec.optimizer)
    random.seed(spec.seed)
    workload = get_workload(spec.workload)
    built = workload.build(spec)
    record.model, record.dataset, record.pretrained = built.model_name, built.dataset_name, built.pretrained
    record.val_rows = None if built.val is None else next(iter(built.val.values())).shape[0]
    record.eval_rows = None if built.eval is None else next(iter(built.eval.values())).shape[0]
    record.metric_ceiling, record.metric_chance = built.metric_ceiling, built.metric_chance
    model = built.model.to(device=device, dtype=precision.param_dtype)
    model.train()
    optimizer = entry.build_for(model, lr=record.lr, **spec.optimizer_kwargs)
    measure.slow_down_if_asked(optimizer)
    return Setup(spec=spec, device=device, precision=precision, workload=workload, built=built, model=model,
                 entry=entry, optimizer=optimizer,
                 scheduler=make_scheduler(optimizer, spec.schedule, spec.steps, spec.warmup_steps),
                 scaler=precision.grad_scaler(device), params=[p for p in model.parameters() if p.requires_grad])


def describe_model(record: Record, model: torch.nn.Module, entry: OptimizerSpec) -> None:
    """Parameter count, weight and gradient bytes, and what the entry's state *should* hold for them."""
    from optbench.optimizers import factored_numel

    params = [p for p in model.parameters() if p.requires_grad]
    record.num_params = sum(p.numel() for p in params)
    record.weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    record.grads_bytes = sum(p.numel() * p.element_size() for p in params)
    record.factored_numel = factored_numel([tuple(p.shape) for p in params])
    facts = entry.analytic_for(model, **record.optimizer_kwargs)  # kwargs such as rank change the count
    record.analytic_state_bytes = facts.state_bytes
    record.analytic_state_bytes_per_param = facts.state_bytes / record.num_params
    record.fp32_state_fraction = facts.fp32_state_numel / record.num_params
    if params and params[0].dtype == torch.bfloat16 and facts.fp32_state_numel == 0 and \
            record.state_precision.startswith("fp32"):
        # torch's optimizers keep their state in the parameters' dtype: "fp32" entries hold bf16 state here
        record.state_precision = "bf16" + record.state_precision.removeprefix("fp32")
    record.optimizer_step_traffic_bytes = facts.step_traffic_bytes


def describe_state(record: Record, optimizer: torch.optim.Optimizer, entry: OptimizerSpec,
                   model: torch.nn.Module | None = None, state_map_dir: str | None = None) -> None:
    """The state the optimizer really holds after training (it is created lazily on the first step), and where it
    sits: per module kind on the record, the full per-parameter map as a CSV in `state_map_dir` when asked."""
    from optbench.memory import statemap

    record.state_bytes, record.state_bytes_by_key = measure.optimizer_state_bytes(optimizer)
    if model is not None:
        rows = statemap.measured_state_map(optimizer, model)
        record.state_bytes_by_module = statemap.bytes_by_module(rows)
        if state_map_dir:
            statemap.write_state_map(rows, Path(state_map_dir) / f"{record.optimizer}-seed{record.seed}-"
                                                                  f"{record.trial_id}.csv")
    record.state_bytes_per_param = record.state_bytes / record.num_params
    record.paged, record.paged_reason = entry.paging(optimizer)
    record.optimizer_impl = measure.optimizer_impl(optimizer)
    if record.rss_growth_after_step_bytes is not None and record.grads_bytes is not None:
        record.held_other_bytes = record.rss_growth_after_step_bytes - record.grads_bytes - record.state_bytes


def describe_bandwidth(record: Record, samples: list[float]) -> None:
    """The roofline's ceiling: median and inter-quartile range of the triad samples taken around training."""
    record.device_bandwidth_bytes_per_s, record.device_bandwidth_iqr_bytes_per_s = measure.median_iqr(samples)


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
    """Steps and training seconds to the first curve point at or past `target` (None when never reached)."""
    record.target_value = target
    for step, seconds, value in record.eval_curve:
        reached = value >= target if record.target_mode == "max" else value <= target
        if reached:
            record.steps_to_target, record.time_to_target_s = int(step), seconds
            return


def check_divergence(record: Record, chance_loss: float) -> None:
    losses = record.loss_curve
    tail = losses[-min(5, len(losses)):]
    record.train_loss_final = sum(tail) / len(tail)
    if record.train_loss_final > DIVERGENCE_FACTOR * max(losses[0], chance_loss):
        raise Diverged(f"final train loss {record.train_loss_final:.3g} is over {DIVERGENCE_FACTOR:g}x "
                       f"the first ({losses[0]:.3g})")


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return "can't allocate memory" in str(exc) or "out of memory" in str(exc).lower()


def run_trial(spec: TrialSpec) -> Record:
    """Run one trial to a record in this process; failures become a status, never an exception."""
    record = record_from_spec(spec)
    start = time.perf_counter()
    try:
        if spec.parallel != "none" and not torch.distributed.is_initialized():
            raise RuntimeError(f"--parallel {spec.parallel} trials run in a torchrun group: run them through the "
                               "sweep (optbench.sweep.run_sweep) or LocalExecutor, not run_trial")
        _train_and_measure(spec, record)
        record.status = "ok"
    except Diverged as exc:
        record.status, record.error = "diverged", str(exc)
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, the sweep goes on
        record.status = "oom" if _is_oom(exc) else "error"
        record.error = f"{type(exc).__name__}: {exc}"
    record.wall_s = time.perf_counter() - start
    return record


def _train_and_measure(spec: TrialSpec, record: Record) -> None:
    from optbench.memory.predict import for_trial

    s = setup(spec, record)
    describe_model(record, s.model, s.entry)
    record.predicted_peak_bytes = for_trial(spec, s.model, s.entry, str(s.device))  # before a step: a prediction
    bandwidth = measure.triad_bandwidth_samples(s.device, BANDWIDTH_SAMPLES)
    check = resume_check(s, record) if spec.resume_check else None
    s.after_step = getattr(check, "after_step", None)
    result = engine_for(spec)(s, record)
    describe_state(record, s.optimizer, s.entry, s.model, spec.state_map_dir)
    result.memory.fill(record)
    split_peak_memory(record)
    describe_bandwidth(record, bandwidth + measure.triad_bandwidth_samples(s.device, BANDWIDTH_SAMPLES))
    measure.describe_speed(record, result.step_times, result.optimizer_times)
    if spec.target is not None:
        time_to_target(record, spec.target)
    if check is not None:
        check.finish(fresh_setup(spec, record))
    evaluate_final(s, record)
    check_divergence(record, s.built.chance_loss)


def resume_check(s: Setup, record: Record) -> Any:
    """The resume check for the trial's engine: the native loop's (torch.save, or torch.distributed.checkpoint in
    a group) or, under Trainer, Trainer's own checkpoint and `resume_from_checkpoint` (set on the setup, which the
    trainer engine reads)."""
    if s.spec.engine == "trainer":
        from optbench.trial.engines.trainer_resume import TrainerResumeCheck

        s.resume = TrainerResumeCheck(s, record)
        return s.resume
    from optbench.trial.engines.resume import ResumeCheck

    return ResumeCheck(s, record)


def fresh_setup(spec: TrialSpec, record: Record) -> Setup:
    """New model, optimizer and schedule from the same spec (what a resumed job builds before loading), wrapped
    for the parallel mode like the trial's own; the trial's record is left as it is."""
    scratch = copy.copy(record)
    s = setup(spec, scratch)
    if spec.parallel != "none":
        from optbench.trial.engines.parallel import prepare

        prepare(s, scratch)
    return s
