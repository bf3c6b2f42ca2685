"""One trial: set up the workload and optimizer, train under an engine, measure, evaluate, return a Record.

Runs inside its own process (see runner.py) so peak memory starts from a clean slate and a crash takes
only this trial down. `python -m optbench.trial SPEC.json RECORD.json` is that process's entry.

The trial reads top to bottom: `setup` (device, workload, precision, optimizer), `describe_model`
(sizes and the analytic state count), the engine's timed loop (engines/), `describe_state` and the
memory and speed figures, then `evaluate_final`. Timing discipline lives in the engine: the first
optimizer step (lazy state creation, compilation) is reported apart as `first_step_s`, the medians
cover the steps after `warmup_steps`, probes and evaluations sit outside the timed intervals.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from optbench import measure
from optbench.environment import cpu_name, environment
from optbench.optimizers import OptimizerSpec, resolve
from optbench.plan import TrialSpec
from optbench.precision import Precision, dtype_name, parse_precision
from optbench.results import Record, split_peak_memory

DIVERGENCE_FACTOR = 3.0  # final loss this many times the first loss (or the chance loss) → diverged
EVAL_CURVE_ROWS = 256  # the fixed subset `--eval-every` evaluates: enough for a curve, cheap enough to repeat
THREADS_ENV = "OPTBENCH_TORCH_THREADS"  # set by the runner when trials share the CPU (--jobs)


class Diverged(RuntimeError):
    """The training loss became non-finite or blew up."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device '{name}'; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device '{name}' asked for, but this torch build sees no CUDA device (use --device cpu)")
    return device


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def record_from_spec(spec: TrialSpec) -> Record:
    """A record holding the trial's settings, before anything is measured (a failed trial keeps these)."""
    from optbench.workloads import WorkloadError, default_lr, get_workload

    try:
        entry = resolve(spec.optimizer)
        name, precision, lr = entry.name, entry.precision, spec.lr or default_lr(spec, entry)
    except (ValueError, WorkloadError):
        name, precision, lr = spec.optimizer, "", spec.lr or 0.0
    record = Record(
        trial_id=spec.trial_id, optimizer=name, optimizer_kwargs=dict(spec.optimizer_kwargs),
        state_precision=precision, workload=spec.workload, model=spec.model or spec.workload,
        dataset=spec.dataset or "embedded-reviews", seed=spec.seed, device=spec.device, steps=spec.steps,
        warmup_steps=spec.warmup_steps, batch_size=spec.batch_size, seq_len=spec.seq_len, lr=lr,
        fidelity=spec.fidelity, started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        stage=spec.stage, engine=spec.engine, parallel=spec.parallel, world_size=spec.nproc,
        precision=spec.precision,
    )
    try:
        workload = get_workload(spec.workload)
        record.target_metric, record.target_mode = workload.target_metric, workload.target_mode
        record.model, record.dataset = workload.model_name(spec), workload.dataset_name(spec)
    except WorkloadError:
        pass
    # Where it would have run and on what: a failed trial's record still lands in its job (compare, report).
    if spec.device == "auto":
        record.device = "cuda" if torch.cuda.is_available() else "cpu"
    record.env = environment()
    return record


@dataclass
class Setup:
    """Everything an engine needs to train one trial."""

    spec: TrialSpec
    device: torch.device
    precision: Precision
    workload: Any  # optbench.workloads.Workload
    built: Any  # optbench.workloads.Built
    model: torch.nn.Module
    entry: OptimizerSpec
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None = None
    params: list[torch.nn.Parameter] = field(default_factory=list)

    @property
    def curve_split(self) -> dict[str, torch.Tensor] | None:
        """The fixed subset `--eval-every` scores: from validation in the tune stage, else from eval."""
        from optbench.workloads.base import take

        split = self.built.val if self.spec.stage == "tune" else self.built.eval
        return None if split is None else take(split, slice(0, EVAL_CURVE_ROWS))


def lr_lambda(warmup_steps: int):
    # Linear warm-up, then constant: the schedule fine-tuning recipes start from, and it keeps the
    # comparison about the optimizers rather than about the decay.
    return lambda step: min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def setup(spec: TrialSpec, record: Record) -> Setup:
    """Device, workload, model in the spec's precision, optimizer and schedule: no step taken yet."""
    from optbench.workloads import get_workload

    device = resolve_device(spec.device)
    record.device, record.device_name = str(device), device_name(device)
    precision = parse_precision(spec.precision)
    record.param_dtype, record.autocast_dtype = dtype_name(precision.param_dtype), dtype_name(precision.autocast_dtype)
    entry = resolve(spec.optimizer)
    random.seed(spec.seed)
    workload = get_workload(spec.workload)
    built = workload.build(spec)
    record.model, record.dataset, record.pretrained = built.model_name, built.dataset_name, built.pretrained
    model = built.model.to(device=device, dtype=precision.param_dtype)
    model.train()
    optimizer = entry.build_for(model, lr=record.lr, **spec.optimizer_kwargs)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(spec.warmup_steps))
    measure.slow_down_if_asked(optimizer)
    return Setup(spec=spec, device=device, precision=precision, workload=workload, built=built, model=model,
                 entry=entry, optimizer=optimizer, scheduler=scheduler, scaler=precision.grad_scaler(device),
                 params=[p for p in model.parameters() if p.requires_grad])


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


def describe_state(record: Record, optimizer: torch.optim.Optimizer, entry: OptimizerSpec) -> None:
    """The state the optimizer really holds after training (it is created lazily on the first step)."""
    record.state_bytes, record.state_bytes_by_key = measure.optimizer_state_bytes(optimizer)
    record.state_bytes_per_param = record.state_bytes / record.num_params
    record.paged, record.paged_reason = entry.paging(optimizer)


def describe_speed(record: Record, step_times: list[float], optimizer_times: list[float]) -> None:
    """Medians, IQRs and the raw samples (after warm-up), throughput and the roofline share."""
    record.step_time_samples_s, record.optimizer_step_samples_s = step_times, optimizer_times
    record.step_time_median_s, record.step_time_iqr_s = measure.median_iqr(step_times)
    record.optimizer_step_median_s, record.optimizer_step_iqr_s = measure.median_iqr(optimizer_times)
    if record.step_time_median_s:
        record.samples_per_s = record.batch_size / record.step_time_median_s
    if record.optimizer_step_median_s and record.device_copy_bandwidth_bytes_per_s and \
            record.optimizer_step_traffic_bytes:
        achieved = record.optimizer_step_traffic_bytes / record.optimizer_step_median_s
        record.roofline_fraction = achieved / record.device_copy_bandwidth_bytes_per_s


def evaluate(s: Setup, split: dict[str, torch.Tensor]) -> dict[str, float]:
    """The workload's metrics on `split`, in eval mode (and the optimizer's eval mode, e.g. schedule-free)."""
    s.model.eval()
    s.entry.before_eval(s.optimizer)
    try:
        with s.precision.autocast(s.device):
            return s.workload.evaluate(s.model, split, s.device)
    finally:
        s.entry.after_eval(s.optimizer)
        s.model.train()


def evaluate_final(s: Setup, record: Record) -> None:
    """Tune trials are scored on the validation split (the eval split was never built for them); others
    on the eval split."""
    if s.spec.stage == "tune":
        record.val_metrics = evaluate(s, s.built.val)
        record.val_metric = record.val_metrics.get(record.target_metric)
        record.val_accuracy = record.val_metrics.get("accuracy")
        return
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
    """Run one trial to a record; failures become a status, never an exception."""
    from optbench.engines import parallel

    if spec.parallel != "none" and not parallel.in_group():
        from optbench.executors import LocalExecutor

        # a torchrun group runs it, as in a sweep; rank 0's record (or the group's failure) comes back
        return LocalExecutor(echo=False).run(spec, {})
    record = record_from_spec(spec)
    start = time.perf_counter()
    try:
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
    from optbench.engines import engine_for

    s = setup(spec, record)
    describe_model(record, s.model, s.entry)
    record.device_copy_bandwidth_bytes_per_s = measure.copy_bandwidth_bytes_per_s(s.device)
    result = engine_for(spec)(s, record)
    describe_state(record, s.optimizer, s.entry)
    result.memory.fill(record)
    split_peak_memory(record)
    describe_speed(record, result.step_times, result.optimizer_times)
    if spec.target is not None:
        time_to_target(record, spec.target)
    evaluate_final(s, record)
    check_divergence(record, s.built.chance_loss)


def apply_process_settings(spec: TrialSpec) -> None:
    """Settings of the trial's own process: a CPU thread share (--jobs) and an address-space cap
    (--max-memory, so a trial that would exhaust the machine fails with an `oom` record instead)."""
    from optbench.child import cap_memory

    threads = os.environ.get(THREADS_ENV)
    if threads:
        torch.set_num_threads(int(threads))
    if spec.max_memory_bytes:
        cap_memory(resolve_device(spec.device), spec.max_memory_bytes)


def main(argv: list[str]) -> int:
    """Child-process entry: read a spec, run it, write the record. Exit 0 whenever a record was written.
    Inside a torchrun group (a parallel trial) each rank runs it and rank 0 writes the gathered record."""
    from optbench.engines import parallel

    spec_path, record_path = Path(argv[0]), Path(argv[1])
    spec = TrialSpec.from_dict(json.loads(spec_path.read_text()))
    apply_process_settings(spec)
    if spec.parallel != "none" and parallel.in_group():
        return parallel.rank_main(spec, record_path)
    record = run_trial(spec)
    record_path.write_text(json.dumps(record.to_dict(), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
