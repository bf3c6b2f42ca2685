"""The trial through an Accelerate loop: `accelerator.prepare` + `accelerator.backward`, as its examples write it.

Accelerate owns the device placement, the autocast (its `mixed_precision`, with its own GradScaler for fp16)
and the data loader: a `DataLoader` over the training split whose batch sampler yields the native loop's
batches (`batch_indices`), so the two engines see the same data in the same order and differ only in the loop.
The registry's optimizer and the trial's schedule go through `prepare`, which wraps them (AcceleratedOptimizer /
AcceleratedScheduler) around the same objects, so the trial measures the very optimizer that ran.

Device: a single-process Accelerate puts everything on `cuda`, i.e. the *current* GPU, so the trial's GPU is
made current first and the placement checked after `prepare` (`placement_agrees`): the warm-up pass, the
prepared model and the loader's batches are then on one device. Timing is the native engine's: the same
`timing.STEP_MARKS` added up by `StepTimer.step_seconds`, the batch copied to the device by the loader before
the step's first mark, fp16's unscale and inf check before the optimizer-step mark. Accelerate's
`optimizer.step()` also holds the scaler's `update()` and a re-read of the finished check (a few microseconds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from optbench.probes import measure
from optbench.probes.timing import StepTimer
from optbench.trial.engines.base import StepLog
from optbench.trial.engines.loop import warm_up
from optbench.trial.engines.resume import ResumeCheck
from optbench.trial.engines.trainer import SplitDataset
from optbench.trial.precision import wrapped_step_will_run
from optbench.workloads.base import batch_indices, rows

if TYPE_CHECKING:
    from optbench.records.record import Record
    from optbench.trial.engines.base import EngineResult, Setup

MIXED_PRECISION = {"bf16-autocast": "bf16", "fp16-autocast": "fp16"}  # others: "no" (pure bf16 is in the weights)


def placement_agrees(placed: torch.device, trial: torch.device, current_index: int | None) -> bool:
    """Whether `placed` (where Accelerate put something) is the trial's device; a CUDA device without an index
    means the current GPU (`current_index`), as it does to torch."""
    if placed.type != trial.type:
        return False
    if placed.type != "cuda":
        return True
    return (placed.index if placed.index is not None else current_index) == \
        (trial.index if trial.index is not None else current_index)


def _check_placement(accelerator, model: torch.nn.Module, device: torch.device) -> None:
    current = torch.cuda.current_device() if device.type == "cuda" else None
    for what, placed in (("its device", accelerator.device), ("the model", next(model.parameters()).device)):
        if not placement_agrees(placed, device, current):
            raise RuntimeError(f"Accelerate put {what} on {placed} but the trial runs on {device}; run the trial "
                               "through `optbench run`, which gives each trial one GPU (CUDA_VISIBLE_DEVICES)")


def _accelerator(s: Setup):
    from accelerate import Accelerator

    if s.device.type == "cuda":
        torch.cuda.set_device(s.device)  # Accelerate's single-process "cuda" is whatever GPU is current
    return Accelerator(cpu=s.device.type == "cpu", mixed_precision=MIXED_PRECISION.get(s.spec.precision, "no"))


def train(s: Setup, record: Record) -> EngineResult:
    spec = s.spec
    accelerator = _accelerator(s)
    order = [index.tolist() for index in batch_indices(rows(s.built.train), spec.batch_size, spec.steps, spec.seed)]
    # its own generator: drawing the loader's base seed must not advance the global RNG that dropout uses
    loader = torch.utils.data.DataLoader(SplitDataset(s.built.train), batch_sampler=order, generator=torch.Generator())
    model, optimizer, scheduler, loader = accelerator.prepare(s.model, s.optimizer, s.scheduler, loader)
    _check_placement(accelerator, model, s.device)
    check = ResumeCheck.if_asked(s, record)  # the native loop's: it saves the same objects, Accelerate wraps them
    warm_up(s)
    memory = measure.MemoryWindow(s.device)
    log = StepLog(s, record, memory, hook=check)
    for step, batch in enumerate(loader):  # the loader has copied the batch to the device already
        timer = StepTimer(s.device)
        timer.mark("start")
        with accelerator.autocast():
            loss = s.workload.loss(model, batch)
        accelerator.backward(loss)
        stepped = wrapped_step_will_run(optimizer)
        timer.mark("backward")
        timer.mark("step")
        optimizer.step()
        timer.mark("stepped")
        timer.mark("zero")
        scheduler.step()  # AcceleratedScheduler does not advance past a skipped step
        optimizer.zero_grad(set_to_none=True)
        timer.mark("end")
        step_s, optimizer_s = timer.step_seconds()
        memory.sample_device_used()
        log.after_step(step, step_s, optimizer_s, loss.item(), stepped)
    s.model = accelerator.unwrap_model(model)
    return log.result(memory, resume=check)
