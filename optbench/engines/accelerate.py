"""The trial through an Accelerate loop: `accelerator.prepare` + `accelerator.backward`, as its examples write it.

Accelerate owns the device placement, the autocast (its `mixed_precision`) and the data loader: a
`DataLoader` over the training split whose batch sampler yields the native loop's batches
(`batch_indices`), so the two engines see the same data in the same order and differ only in the loop.
The registry's optimizer and the trial's
schedule go through `prepare`, which wraps them (AcceleratedOptimizer / AcceleratedScheduler) around the
same objects, so the trial measures the very optimizer that ran. Timing follows the native engine:
`measure.StepTimer` marks, one synchronize at the end of the step on CUDA.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from optbench import measure
from optbench.engines.base import EngineResult, StepLog
from optbench.engines.native import warm_up
from optbench.engines.trainer import SplitDataset
from optbench.workloads.base import batch_indices, rows

if TYPE_CHECKING:
    from optbench.engines.base import Setup
    from optbench.results import Record

MIXED_PRECISION = {"bf16-autocast": "bf16", "fp16-autocast": "fp16"}  # others: "no" (pure bf16 is in the weights)


def train(s: Setup, record: Record) -> EngineResult:
    from accelerate import Accelerator

    spec = s.spec
    accelerator = Accelerator(cpu=s.device.type == "cpu", mixed_precision=MIXED_PRECISION.get(spec.precision, "no"))
    order = [index.tolist() for index in batch_indices(rows(s.built.train), spec.batch_size, spec.steps, spec.seed)]
    # its own generator: drawing the loader's base seed must not advance the global RNG that dropout uses
    loader = torch.utils.data.DataLoader(SplitDataset(s.built.train), batch_sampler=order, generator=torch.Generator())
    model, optimizer, scheduler, loader = accelerator.prepare(s.model, s.optimizer, s.scheduler, loader)
    warm_up(s)
    memory = measure.MemoryWindow(s.device)
    log = StepLog(s, record, memory)
    for step, batch in enumerate(loader):
        timer = measure.StepTimer(s.device)
        timer.mark("start")
        with accelerator.autocast():
            loss = s.workload.loss(model, batch)
        accelerator.backward(loss)
        timer.mark("step")
        optimizer.step()
        timer.mark("stepped")
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        timer.mark("end")
        log.after_step(step, timer.seconds("start", "end"), timer.seconds("step", "stepped"), loss.item())
    s.model = accelerator.unwrap_model(model)
    return log.result(memory)
