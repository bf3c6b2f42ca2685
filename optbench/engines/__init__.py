"""Engines: the loop that trains a prepared trial (`trial.Setup`) and returns its timings.

`native` is optbench's own loop. An engine is a function `(setup, record) -> EngineResult` that trains
`setup.spec.steps` steps, fills `record.loss_curve`, `first_step_s` and `eval_curve`, and returns the
memory window it opened plus the per-step times after warm-up; the trial does the rest.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optbench.measure import MemoryWindow
    from optbench.results import Record
    from optbench.trial import Setup

ENGINES = ("native",)


@dataclass
class EngineResult:
    memory: MemoryWindow  # opened after setup and the warm-up pass: the trial reads its peaks
    step_times: list[float]  # whole steps after warm-up, seconds
    optimizer_times: list[float]  # optimizer.step() alone, same steps


Engine = Callable[["Setup", "Record"], EngineResult]


def get_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise ValueError(f"unknown engine '{name}'; known: {', '.join(ENGINES)}")
    return importlib.import_module(f"optbench.engines.{name}").train
