"""The native loop's steps, shared by the native engine, the engines built on its pieces and the resume check.

Per step: move one batch to the device (before the timed intervals), forward under the precision's autocast,
backward (through the GradScaler for fp16 on CUDA, which then unscales the gradients and checks them for
inf/NaN), optimizer step, zero_grad and schedule, timed with `timing.StepTimer` at `timing.STEP_MARKS`. The gaps
between intervals hold the untimed probes (fidelity, RSS after the last step).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from optbench.probes import measure
from optbench.probes.timing import StepTimer
from optbench.trial.precision import unscale_and_check
from optbench.workloads import train_batches
from optbench.workloads.base import to_device

if TYPE_CHECKING:
    import torch

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
            memory.hold_after_last_step()
        timer.mark("zero")
        finish_step(s, stepped)
        timer.mark("end")
        step_s, optimizer_s = timer.step_seconds()
        if memory is not None:
            memory.sample_device_used()
        yield StepSample(step, step_s, optimizer_s, stepped, loss.item())
