"""optbench's own training loop: plain PyTorch, timed the way a GPU needs.

Per step: move one batch to the device (before the timed intervals), forward under the precision's autocast,
backward (through the GradScaler for fp16 on CUDA, which then unscales the gradients and checks them for
inf/NaN), optimizer step, zero_grad and schedule. Three intervals are timed with `timing.StepTimer` and added
up the way every engine adds them up (`timing.STEP_MARKS`): forward/backward, optimizer.step() alone,
zero_grad + schedule — CUDA events, one synchronize at the end of the step (the GradScaler's own inf check aside),
perf_counter on CPU. The gaps between intervals hold the untimed probes (fidelity, RSS after the last step);
`--eval-every` evaluations run between steps, so neither shows in the medians. A step the GradScaler skips is
trained on but kept out of `first_step_s` and the medians (`base.StepLog`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from optbench.probes import measure
from optbench.probes.timing import StepTimer
from optbench.trial.engines.base import EngineResult, StepLog
from optbench.trial.precision import unscale_and_check
from optbench.workloads import train_batches
from optbench.workloads.base import to_device

if TYPE_CHECKING:
    import torch

    from optbench.records.record import Record
    from optbench.trial.engines.base import Setup


class StepSample(NamedTuple):
    """One trained step as `timed_steps` yields it (the loss last: callers that want only it unpack `*_, loss`)."""

    step: int
    step_s: float
    optimizer_s: float
    stepped: bool  # False: the GradScaler skipped optimizer.step() (inf/NaN gradients)
    loss: float


def warm_up(s: Setup) -> None:
    """One forward/backward before the memory baseline pages in the kernels and warms the allocator,
    which every optimizer would otherwise be charged for; its gradients are dropped. An entry that updates inside
    backward (layer-wise, LOMO: its hooks would train on the warm-up batch) gets the forward alone."""
    import torch

    batch = to_device(next(train_batches(s.built.train, s.spec.batch_size, 1, s.spec.seed)), s.device)
    if s.entry.step_in_backward:
        with torch.no_grad(), s.precision.autocast(s.device):
            s.workload.loss(s.model, batch)
        return
    with s.precision.autocast(s.device):
        loss = s.workload.loss(s.model, batch)
    loss.backward()
    s.model.zero_grad(set_to_none=True)


def forward_backward(s: Setup, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, bool]:
    """The loss and its gradients; under a GradScaler the loss is scaled, and the gradients are then unscaled and
    checked here, inside this interval, so the check's wait is the step's cost but not optimizer.step()'s.
    Returns the loss and whether optimizer.step() is to run."""
    with s.precision.autocast(s.device):
        loss = s.workload.loss(s.model, batch)
    if s.scaler is None:
        loss.backward()
        return loss, True
    s.scaler.scale(loss).backward()
    return loss, unscale_and_check(s.scaler, s.optimizer)


def finish_step(s: Setup, stepped: bool) -> None:
    """zero_grad, the scaler's new scale, and the schedule — which, as in Accelerate and Trainer, does not advance
    past a step the scaler skipped."""
    s.optimizer.zero_grad(set_to_none=True)
    if s.scaler is not None:
        s.scaler.update()
    if stepped:
        s.scheduler.step()


def timed_steps(s: Setup, start: int = 0, stop: int | None = None, probe: Any = None,
                memory: measure.MemoryWindow | None = None) -> Iterator[StepSample]:
    """Train steps `start` to `stop` (default: the job's end) on the job's batches, in the job's one order; yield a
    StepSample after each. A resumed run starts mid-way on the batches the uninterrupted run would have seen
    there. `memory`: the window whose RSS after the last step is recorded and whose device memory is sampled."""
    spec = s.spec
    stop = spec.steps if stop is None else stop
    for step, cpu_batch in enumerate(train_batches(s.built.train, spec.batch_size, stop, spec.seed)):
        if step < start:
            continue
        batch = to_device(cpu_batch, s.device)
        timer = StepTimer(s.device)
        timer.mark("start")
        loss, stepped = forward_backward(s, batch)
        timer.mark("backward")
        if probe is not None:
            probe.before_step(skip=not stepped)
        timer.mark("step")
        if stepped:
            s.optimizer.step()
        timer.mark("stepped")
        if probe is not None:
            probe.after_step()
        if memory is not None and step == spec.steps - 1:
            s.held_after_step_bytes = memory.rss_growth_bytes()
        timer.mark("zero")
        finish_step(s, stepped)
        timer.mark("end")
        step_s, optimizer_s = timer.step_seconds()
        if memory is not None:
            memory.sample_device_used()
        yield StepSample(step, step_s, optimizer_s, stepped, loss.item())


def train(s: Setup, record: Record) -> EngineResult:
    from optbench.probes.fidelity import UpdateFidelity, median_of

    spec = s.spec
    # Built before the baseline so its fixed buffers (parameter snapshot + shadow parameters) sit in it;
    # the shadow's moments appear lazily on its first step and do land in the peaks: hence `fidelity`.
    probe = UpdateFidelity(s.optimizer) if spec.fidelity else None
    warm_up(s)
    memory = measure.MemoryWindow(s.device)
    log = StepLog(s, record, memory)
    progress = _progress(spec, record)
    for sample in timed_steps(s, probe=probe, memory=memory):
        progress.update(1)
        progress.set_postfix(loss=f"{sample.loss:.3f}", refresh=False)
        log.after_step(sample.step, sample.step_s, sample.optimizer_s, sample.loss, sample.stepped)
    progress.close()
    record.rss_growth_after_step_bytes = s.held_after_step_bytes
    record.paged_state_bytes = measure.paged_state_bytes(s.optimizer)
    if probe is not None:
        record.update_cosine_curve, record.update_rel_error_curve = probe.cosines, probe.rel_errors
        record.update_cosine_median = median_of(probe.cosines)
        record.update_rel_error_median = median_of(probe.rel_errors)
    return log.result(memory)


def _progress(spec, record: Record):
    from tqdm.auto import tqdm

    # A bar only on a terminal (the runner sets OPTBENCH_PROGRESS=1 when its own stderr is one): a log
    # file would collect every carriage-return frame.
    on_terminal = sys.stderr.isatty() or os.environ.get("OPTBENCH_PROGRESS") == "1"
    return tqdm(total=spec.steps, desc=f"{record.optimizer} seed={spec.seed}", unit="step", file=sys.stderr,
                leave=False, dynamic_ncols=True, disable=not on_terminal)
