"""One trial: build the workload, train it with one optimizer under the probes, evaluate, return a Record.

Runs inside its own process (see runner.py) so peak memory starts from a clean slate and a crash
takes only this trial down. `python -m optbench.trial SPEC.json RECORD.json` is that process's entry.

Timing discipline: the first optimizer step (lazy state creation, compilation) is reported apart as
`first_step_s`; the medians cover the steps after `warmup_steps`; every interval is bracketed by a
CUDA synchronize. Fidelity probing (`spec.fidelity`, see fidelity.py) happens between the timed
intervals, so it costs wall time but never shows in `step_time_*` or `optimizer_step_*`.
"""

from __future__ import annotations

import gc
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import torch

from optbench import measure
from optbench.fidelity import UpdateFidelity, median_of
from optbench.optimizers import resolve
from optbench.plan import TrialSpec
from optbench.results import Record, cpu_name, environment, split_peak_memory

DIVERGENCE_FACTOR = 3.0  # final loss this many times the first loss (or non-finite) → diverged


class Diverged(RuntimeError):
    """The training loss became non-finite or blew up."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device '{name}' asked for, but this torch build sees no CUDA device")
    return device


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def record_from_spec(spec: TrialSpec) -> Record:
    """A record holding the trial's settings, before anything is measured (a failed trial keeps these)."""
    try:
        optimizer = resolve(spec.optimizer)
        name, precision, lr = optimizer.name, optimizer.precision, spec.lr or optimizer.default_lr
    except ValueError:
        name, precision, lr = spec.optimizer, "", spec.lr or 0.0
    return Record(
        trial_id=spec.trial_id, optimizer=name, optimizer_kwargs=dict(spec.optimizer_kwargs),
        state_precision=precision, workload=spec.workload, model=spec.model or spec.workload,
        dataset=spec.dataset or "embedded-reviews", seed=spec.seed, device=spec.device, steps=spec.steps,
        warmup_steps=spec.warmup_steps, batch_size=spec.batch_size, seq_len=spec.seq_len, lr=lr,
        fidelity=spec.fidelity, started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def train_batches(train: dict[str, torch.Tensor], batch_size: int, steps: int, seed: int):
    """`steps` batches, reshuffling each epoch from the trial's seed (same order for every optimizer)."""
    generator = torch.Generator().manual_seed(seed)
    rows = train["labels"].shape[0]
    order = torch.randperm(rows, generator=generator)
    cursor = 0
    for _ in range(steps):
        if cursor + batch_size > rows:
            order, cursor = torch.randperm(rows, generator=generator), 0
        index = order[cursor: cursor + batch_size]
        cursor += batch_size
        yield {k: v[index] for k, v in train.items()}


def evaluate(model: torch.nn.Module, split: dict[str, torch.Tensor], num_labels: int,
             device: torch.device, batch_size: int = 64) -> tuple[float, float]:
    """Accuracy and macro-F1 (the mean over classes of per-class F1, absent classes scoring 0)."""
    model.eval()
    predictions = []
    with torch.no_grad():
        for start in range(0, split["labels"].shape[0], batch_size):
            batch = {k: v[start: start + batch_size].to(device) for k, v in split.items() if k != "labels"}
            predictions.append(model(**batch).logits.argmax(-1).cpu())
    model.train()
    predicted, truth = torch.cat(predictions), split["labels"]
    accuracy = (predicted == truth).float().mean().item()
    f1s = []
    for label in range(num_labels):
        tp = ((predicted == label) & (truth == label)).sum().item()
        fp = ((predicted == label) & (truth != label)).sum().item()
        fn = ((predicted != label) & (truth == label)).sum().item()
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return accuracy, sum(f1s) / num_labels


def _lr_lambda(warmup_steps: int):
    # Linear warm-up, then constant: the schedule fine-tuning recipes start from, and it keeps the
    # comparison about the optimizers rather than about the decay.
    return lambda step: min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def factored_numel(shapes: Sequence[Sequence[int]]) -> int:
    """Σ rows + columns over tensors of rank >= 2 (numel for vectors): what a factored second moment keeps.

    Adafactor stores a row and a column statistic per matrix instead of one value per element, so its
    state grows with this count, not with the parameter count (scaling.py fits it against this).
    """
    total = 0
    for shape in shapes:
        if len(shape) >= 2:
            total += math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]
        else:
            total += math.prod(shape)
    return total


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return "can't allocate memory" in str(exc) or "out of memory" in str(exc).lower()


def run_trial(spec: TrialSpec) -> Record:
    """Run one trial to a record; failures become a status, never an exception."""
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
    from optbench.workloads import build_workload

    device = resolve_device(spec.device)
    record.device, record.device_name = str(device), device_name(device)
    record.env = environment()
    optimizer_spec = resolve(spec.optimizer)
    random.seed(spec.seed)
    workload = build_workload(spec)
    record.model, record.dataset = workload.model_name, workload.dataset_name
    model = workload.model.to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    num_params = sum(p.numel() for p in params)
    record.num_params = num_params
    record.weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    record.grads_bytes = sum(p.numel() * p.element_size() for p in params)
    record.factored_numel = factored_numel([tuple(p.shape) for p in params])
    record.analytic_state_bytes = optimizer_spec.analytic_state_bytes([tuple(p.shape) for p in params])
    record.analytic_state_bytes_per_param = record.analytic_state_bytes / num_params

    optimizer = optimizer_spec.build(params, lr=record.lr, **spec.optimizer_kwargs)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(spec.warmup_steps))
    batches = [{k: v.to(device) for k, v in b.items()}
               for b in train_batches(workload.train, spec.batch_size, spec.steps, spec.seed)]
    # Built before the baseline so its fixed buffers (parameter snapshot + shadow parameters) sit in it;
    # the shadow's moments appear lazily on its first step and do land in the peaks: hence `fidelity`.
    probe = UpdateFidelity(optimizer) if spec.fidelity else None

    # One forward/backward before the baseline pages in the kernels and warms the allocator, which
    # every optimizer would otherwise be charged for; its gradients are dropped.
    model(**batches[0]).loss.backward()
    model.zero_grad(set_to_none=True)
    gc.collect()
    rss_baseline = measure.current_rss_bytes()
    measure.reset_peaks(device)

    step_times: list[float] = []
    optimizer_times: list[float] = []
    losses: list[float] = []
    progress = _progress(spec, record)
    for step, batch in enumerate(batches):
        # Three timed intervals: forward/backward [t0, t1], optimizer step [t2, t3], zero_grad and
        # scheduler [t4, t5]. The gaps between them hold the probes (fidelity, RSS), which are untimed.
        t0 = measure.clock(device)
        loss = model(**batch).loss
        loss.backward()
        t1 = measure.clock(device)
        if probe is not None:
            probe.before_step()
        t2 = measure.clock(device)
        optimizer.step()
        t3 = measure.clock(device)
        if probe is not None:
            probe.after_step()
        if step == spec.steps - 1 and rss_baseline is not None:
            record.rss_growth_after_step_bytes = measure.current_rss_bytes() - rss_baseline
        t4 = measure.clock(device)
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        t5 = measure.clock(device)
        step_time = (t1 - t0) + (t3 - t2) + (t5 - t4)
        loss_value = loss.item()
        losses.append(loss_value)
        if step == 0:
            record.first_step_s = step_time
        elif step >= spec.warmup_steps:
            step_times.append(step_time)
            optimizer_times.append(t3 - t2)
        progress.update(1)
        progress.set_postfix(loss=f"{loss_value:.3f}", refresh=False)
        if not math.isfinite(loss_value):
            record.loss_curve = losses
            raise Diverged(f"loss became {loss_value} at step {step}")
    progress.close()

    record.peak_cuda_allocated_bytes, record.peak_cuda_reserved_bytes = measure.cuda_peaks(device)
    record.peak_rss_bytes = measure.peak_rss_bytes()
    if rss_baseline is not None and record.peak_rss_bytes is not None:
        record.peak_rss_growth_bytes = record.peak_rss_bytes - rss_baseline
    record.state_bytes, record.state_bytes_by_key = measure.optimizer_state_bytes(optimizer)
    record.state_bytes_per_param = record.state_bytes / num_params
    split_peak_memory(record)
    if probe is not None:
        record.update_cosine_curve, record.update_rel_error_curve = probe.cosines, probe.rel_errors
        record.update_cosine_median = median_of(probe.cosines)
        record.update_rel_error_median = median_of(probe.rel_errors)
    record.step_time_median_s, record.step_time_iqr_s = measure.median_iqr(step_times)
    record.optimizer_step_median_s, record.optimizer_step_iqr_s = measure.median_iqr(optimizer_times)
    if record.step_time_median_s:
        record.samples_per_s = spec.batch_size / record.step_time_median_s
    record.loss_curve = losses
    tail = losses[-min(5, len(losses)):]
    record.train_loss_final = sum(tail) / len(tail)
    record.eval_accuracy, record.eval_f1 = evaluate(model, workload.eval, workload.num_labels, device)
    if record.train_loss_final > DIVERGENCE_FACTOR * max(losses[0], math.log(workload.num_labels)):
        raise Diverged(f"final train loss {record.train_loss_final:.3g} is over {DIVERGENCE_FACTOR:g}x "
                       f"the first ({losses[0]:.3g})")


def _progress(spec: TrialSpec, record: Record):
    from tqdm.auto import tqdm

    return tqdm(total=spec.steps, desc=f"{record.optimizer} seed={spec.seed}", unit="step",
                file=sys.stderr, leave=False, dynamic_ncols=True)


def main(argv: list[str]) -> int:
    """Child-process entry: read a spec, run it, write the record. Exit 0 whenever a record was written."""
    spec_path, record_path = Path(argv[0]), Path(argv[1])
    spec = TrialSpec.from_dict(json.loads(spec_path.read_text()))
    record = run_trial(spec)
    record_path.write_text(json.dumps(record.to_dict(), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
