"""Engines: the loop that trains a prepared trial (`base.Setup`) and returns what it measured (`base.EngineResult`).

`native` is optbench's own loop, `trainer` runs the trial through Hugging Face `Trainer` and `accelerate` through
an Accelerate loop (the loops people train with; same optimizer, same state); a parallel mode (ddp, zero1, fsdp2:
`parallel.py`) wraps the native loop in each rank of a torchrun group. The native loop's steps are in `loop.py`;
each engine picks its own `--resume-check` (`resume.py`, or `trainer_resume.py` under Trainer) and returns it. What
an engine gets and returns is in `base.py`; engines import nothing above them (not the trial that calls them, not
the process layer that starts the trial).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from optbench.trial.engines.base import EVAL_CURVE_ROWS, Diverged, EngineResult, Setup, StepLog, evaluate

if TYPE_CHECKING:
    from optbench.job.spec import TrialSpec
    from optbench.records.record import Record

__all__ = ["ENGINES", "EVAL_CURVE_ROWS", "Diverged", "Engine", "EngineResult", "Setup", "StepLog", "engine_for",
           "evaluate", "get_engine"]

ENGINES = ("native", "trainer", "accelerate")

Engine = Callable[["Setup", "Record"], EngineResult]


def get_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise ValueError(f"unknown engine '{name}'; known: {', '.join(ENGINES)}")
    return importlib.import_module(f"optbench.trial.engines.{name}").train


def engine_for(spec: TrialSpec) -> Engine:
    """The spec's engine; a parallel mode (ddp, zero1, fsdp2) trains through engines/parallel.py."""
    if spec.parallel != "none":
        return importlib.import_module("optbench.trial.engines.parallel").train
    return get_engine(spec.engine)
