"""optbench's own training loop: plain PyTorch, timed the way a GPU needs.

Per step: move one batch to the device, forward under the precision's autocast, backward (through the
GradScaler for fp16 on CUDA), optimizer step, zero_grad and schedule. Three intervals are timed —
forward/backward, optimizer step, zero_grad + schedule — with `measure.StepTimer`: CUDA events, one
synchronize at the end of the step (never between backward and step()), perf_counter on CPU. The gaps
between intervals hold the untimed probes (fidelity, RSS after the last step); `--eval-every`
evaluations run between steps, so neither shows in the medians.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from optbench import measure
from optbench.engines.base import EngineResult, StepLog
from optbench.workloads import train_batches
from optbench.workloads.base import to_device

if TYPE_CHECKING:
    from optbench.engines.base import Setup
    from optbench.results import Record


def warm_up(s: Setup) -> None:
    """One forward/backward before the memory baseline pages in the kernels and warms the allocator,
    which every optimizer would otherwise be charged for; its gradients are dropped."""
    batch = to_device(next(train_batches(s.built.train, s.spec.batch_size, 1, s.spec.seed)), s.device)
    with s.precision.autocast(s.device):
        loss = s.workload.loss(s.model, batch)
    loss.backward()
    s.model.zero_grad(set_to_none=True)


def optimizer_step(s: Setup) -> None:
    if s.scaler is None:
        s.optimizer.step()
    else:
        s.scaler.step(s.optimizer)
        s.scaler.update()


def timed_steps(s: Setup, start: int = 0, stop: int | None = None, probe: Any = None,
                memory: measure.MemoryWindow | None = None) -> Iterator[tuple[int, float, float, float]]:
    """Train steps `start` to `stop` (default: the job's end) on the job's batches, in the job's one order; yield
    (step, step seconds, optimizer-step seconds, loss) after each. A resumed run starts mid-way on the batches the
    uninterrupted run would have seen there. `memory`: the window whose RSS after the last step is recorded."""
    spec = s.spec
    stop = spec.steps if stop is None else stop
    for step, cpu_batch in enumerate(train_batches(s.built.train, spec.batch_size, stop, spec.seed)):
        if step < start:
            continue
        batch = to_device(cpu_batch, s.device)
        timer = measure.StepTimer(s.device)
        timer.mark("start")
        with s.precision.autocast(s.device):
            loss = s.workload.loss(s.model, batch)
        (loss if s.scaler is None else s.scaler.scale(loss)).backward()
        timer.mark("backward")
        if probe is not None:
            probe.before_step()
        timer.mark("step")
        optimizer_step(s)
        timer.mark("stepped")
        if probe is not None:
            probe.after_step()
        if memory is not None and step == spec.steps - 1:
            s.held_after_step_bytes = memory.rss_growth_bytes()
        timer.mark("zero")
        s.optimizer.zero_grad(set_to_none=True)
        s.scheduler.step()
        timer.mark("end")
        step_s = timer.seconds("start", "backward") + timer.seconds("step", "stepped") + timer.seconds("zero", "end")
        yield step, step_s, timer.seconds("step", "stepped"), loss.item()


def train(s: Setup, record: Record) -> EngineResult:
    from optbench.fidelity import UpdateFidelity, median_of

    spec = s.spec
    # Built before the baseline so its fixed buffers (parameter snapshot + shadow parameters) sit in it;
    # the shadow's moments appear lazily on its first step and do land in the peaks: hence `fidelity`.
    probe = UpdateFidelity(s.optimizer) if spec.fidelity else None
    warm_up(s)
    memory = measure.MemoryWindow(s.device)
    log = StepLog(s, record, memory)
    progress = _progress(spec, record)
    for step, step_s, optimizer_s, loss_value in timed_steps(s, probe=probe, memory=memory):
        progress.update(1)
        progress.set_postfix(loss=f"{loss_value:.3f}", refresh=False)
        log.after_step(step, step_s, optimizer_s, loss_value)
    progress.close()
    record.rss_growth_after_step_bytes = s.held_after_step_bytes
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
