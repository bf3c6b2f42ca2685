"""Engines: the loop that trains a prepared trial (`trial.Setup`) and returns its timings.

`native` is optbench's own loop, `trainer` runs the trial through Hugging Face `Trainer` and
`accelerate` through an Accelerate loop (the loops people train with; same optimizer, same state); a
parallel mode (ddp, zero1, fsdp2: `parallel.py`) wraps the native loop in each rank of a torchrun
group. An engine is a function `(setup, record) -> EngineResult` that trains
`setup.spec.steps` steps, fills `record.loss_curve`, `first_step_s` and `eval_curve`, and returns the
memory window it opened plus the per-step times after warm-up; the trial does the rest.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optbench.measure import MemoryWindow
    from optbench.plan import TrialSpec
    from optbench.results import Record
    from optbench.trial import Setup

ENGINES = ("native", "trainer", "accelerate")


@dataclass
class EngineResult:
    memory: MemoryWindow  # opened after setup and the warm-up pass: the trial reads its peaks
    step_times: list[float]  # whole steps after warm-up, seconds
    optimizer_times: list[float]  # optimizer.step() alone, same steps


Engine = Callable[["Setup", "Record"], EngineResult]


class StepLog:
    """What a loop records after each step, the same in every engine: the loss curve, the first step
    apart, the step and optimizer-step samples after warm-up, divergence, and the `--eval-every` curve
    (evaluated between steps, on the fixed subset, against training seconds so far)."""

    def __init__(self, s: Setup, record: Record) -> None:
        self.s, self.record = s, record
        self.curve_split = s.curve_split if s.spec.eval_every else None
        self.step_times: list[float] = []
        self.optimizer_times: list[float] = []
        self.trained_s = 0.0

    def after_step(self, step: int, step_s: float, optimizer_s: float, loss_value: float) -> None:
        from optbench.trial import Diverged, evaluate

        spec, record = self.s.spec, self.record
        self.trained_s += step_s
        record.loss_curve.append(loss_value)
        if step == 0:
            record.first_step_s = step_s
        elif step >= spec.warmup_steps:
            self.step_times.append(step_s)
            self.optimizer_times.append(optimizer_s)
        if not math.isfinite(loss_value):
            raise Diverged(f"loss became {loss_value} at step {step}")
        if self.curve_split is not None and (step + 1) % spec.eval_every == 0:
            value = evaluate(self.s, self.curve_split)[record.target_metric]
            record.eval_curve.append([step + 1, self.trained_s, value])

    def result(self, memory: MemoryWindow) -> EngineResult:
        return EngineResult(memory=memory, step_times=self.step_times, optimizer_times=self.optimizer_times)


def get_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise ValueError(f"unknown engine '{name}'; known: {', '.join(ENGINES)}")
    return importlib.import_module(f"optbench.engines.{name}").train


def engine_for(spec: TrialSpec) -> Engine:
    """The spec's engine; a parallel mode (ddp, zero1, fsdp2) trains through engines/parallel.py."""
    if spec.parallel != "none":
        return importlib.import_module("optbench.engines.parallel").train
    return get_engine(spec.engine)
