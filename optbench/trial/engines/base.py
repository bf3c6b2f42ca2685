"""What every engine gets and gives back: the prepared trial (`Setup`), its per-step log and its result.

An engine is a function `(setup, record) -> EngineResult` that trains `setup.spec.steps` steps, appends to
`record.loss_curve` and `eval_curve` as it goes (a diverged trial keeps its curve up to the failure), and returns
what it measured: the memory window it opened, the step samples, its resume check under `--resume-check` (each
engine picks its own) and the fidelity probe. The trial (optbench/trial/run.py) builds the `Setup` before and
fills the record from the result once after (trial/describe.py). These types live here, below both, so that the
engines never import the trial that calls them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from optbench.job.spec import TrialSpec
    from optbench.optimizers import OptimizerSpec
    from optbench.probes.fidelity import UpdateFidelity
    from optbench.probes.measure import MemoryWindow
    from optbench.probes.paired import PairedStream
    from optbench.probes.timing import StepSamples
    from optbench.records.record import Record
    from optbench.trial.precision import Precision

EVAL_CURVE_ROWS = 256  # the fixed subset `--eval-every` evaluates: enough for a curve, cheap enough to repeat


class Diverged(RuntimeError):
    """The training loss became non-finite or blew up."""


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
    scaler: torch.amp.GradScaler | None = None
    params: list[torch.nn.Parameter] = field(default_factory=list)
    optimizer: torch.optim.Optimizer = None  # type: ignore[assignment]  # made by install_optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler = None  # type: ignore[assignment]

    @property
    def curve_split(self) -> dict[str, torch.Tensor] | None:
        """The fixed subset `--eval-every` scores: the head of the eval split (of validation where none was built)."""
        from optbench.workloads.base import take

        split = self.built.eval if self.built.eval is not None else self.built.val
        return None if split is None else take(split, slice(0, EVAL_CURVE_ROWS))

    def install_optimizer(self, make: Callable[[], torch.optim.Optimizer]) -> None:
        """The one place a trial's optimizer is made (at setup, and again before any step where a parallel mode
        wraps or shards it): the schedule attached to it, and the test-only slowdown knob applied, a no-op unless
        set (probes/slowdown.py: its one seam into production code)."""
        from optbench.probes.slowdown import slow_down_if_asked
        from optbench.trial.schedules import make_scheduler

        self.optimizer = make()
        self.scheduler = make_scheduler(self.optimizer, self.spec.schedule, self.spec.steps, self.spec.warmup_steps)
        slow_down_if_asked(self.optimizer)


def evaluate(s: Setup, split: dict[str, torch.Tensor]) -> dict[str, float]:
    """The workload's metrics on `split`, in eval mode (and the optimizer's eval mode, e.g. schedule-free).
    Under FSDP2 the model is sharded again afterwards: a forward with no backward leaves the root module's
    parameters gathered, and the optimizer's state, keyed by the sharded ones, then matched no parameter of the
    model (every fsdp2 trial with an eval curve ended `error` in the state map)."""
    s.model.eval()
    s.entry.before_eval(s.optimizer)
    try:
        with s.precision.autocast(s.device):
            return s.workload.evaluate(s.model, split, s.device)
    finally:
        s.entry.after_eval(s.optimizer)
        s.model.train()
        if s.spec.parallel == "fsdp2":
            from torch.distributed.fsdp import FSDPModule

            for module in s.model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()


@dataclass
class EngineResult:
    """What an engine measured, for the one function that fills the record from it (trial/describe.py)."""

    memory: MemoryWindow | None  # opened after setup and the warm-up pass (None: training never began)
    samples: StepSamples  # the step times by role: first step, warm-up, timed, skipped
    resume: Any = None  # the engine's resume check under --resume-check: the trial finishes it after describing
    fidelity: UpdateFidelity | None = None  # --fidelity: the update-fidelity probe, its curves filled
    paired: PairedStream | None = None  # --paired-probe: the stream kernel's pass after each step


class StepHook(Protocol):
    """Work between two steps that is neither timed nor training memory (the resume check's save)."""

    def acts_at(self, step: int) -> bool:
        """Whether `after_step(step)` has work: the loop pauses the memory window only then."""
        ...

    def after_step(self, step: int) -> None:
        """The work, called only at the steps where `acts_at` says there is some."""
        ...


class StepLog:
    """What a loop records after each step, the same in every engine: the loss curve, the step and optimizer-step
    samples sorted by `timing.StepSamples` (warm-up out, the first step that stepped apart, a step an fp16 loss
    scaler skipped listed in `record.skipped_steps` and kept out of the medians), divergence, the `--eval-every`
    curve (evaluated between steps, on the fixed subset, against training seconds so far, outside the memory
    window's peak: see `MemoryWindow.paused`) and the hook the engine passes (its resume check's save, called with
    the step's index outside the timed intervals and the memory window's peak, at the steps where it acts)."""

    def __init__(self, s: Setup, record: Record, memory: MemoryWindow | None = None,
                 hook: StepHook | None = None) -> None:
        from optbench.probes.timing import StepSamples

        self.s, self.record, self.memory, self.hook = s, record, memory, hook
        self.curve_split = s.curve_split if s.spec.eval_every else None
        self.samples = StepSamples(s.spec.warmup_steps)
        self.trained_s = 0.0

    def after_step(self, step: int, step_s: float, optimizer_s: float, loss_value: float,
                   stepped: bool = True) -> None:
        spec, record = self.s.spec, self.record
        self.trained_s += step_s
        record.loss_curve.append(loss_value)
        self.samples.add(step, step_s, optimizer_s, stepped)
        if not math.isfinite(loss_value):
            raise Diverged(f"loss became {loss_value} at step {step}")
        if self.curve_split is not None and (step + 1) % spec.eval_every == 0:
            record.eval_curve.append([step + 1, self.trained_s, self._curve_point()])
        if self.hook is not None and self.hook.acts_at(step):
            if self.memory is None:
                self.hook.after_step(step)
            else:  # a pause collects garbage, trims the heap and empties the CUDA cache: only where there is work
                with self.memory.paused():
                    self.hook.after_step(step)

    def _curve_point(self) -> float:
        """One eval-curve value; its memory (an LM's fp32 logits) must not count as the training peak."""
        if self.memory is None:
            return evaluate(self.s, self.curve_split)[self.record.target_metric]
        with self.memory.paused():
            return evaluate(self.s, self.curve_split)[self.record.target_metric]

    def result(self, memory: MemoryWindow, resume: Any = None, fidelity: UpdateFidelity | None = None,
               paired: PairedStream | None = None) -> EngineResult:
        return EngineResult(memory=memory, samples=self.samples, resume=resume, fidelity=fidelity, paired=paired)
