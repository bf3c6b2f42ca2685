"""`OptbenchCallback`: one optbench record per `Trainer.train()`, appended to a results file.

Added to any `transformers.Trainer`, it measures what optbench's own trials measure and writes one record
of the usual schema, so `python -m optbench report` tabulates a user's run next to optbench's:
optimizer-state bytes per key (after training: state is created on the first step), peak memory over a
window opened at `on_train_begin`, step-time medians after `warmup_steps`, the evaluations run during
training, the settings and the environment stamp.

Where the memory baseline sits: at `on_train_begin` the model and the optimizer object exist on the
device but no step has run, so the window's growth is what training adds — gradients, optimizer state,
activations and the first-use cost of the kernels (optbench's trial runs one untimed forward/backward
before opening its window to keep that last part out; a user's run has no such pass, so its growth
reads a little higher than the trial's for the same job).

Timing is optbench's native engine's (optbench/probes/timing.py): the step's marks are CUDA events on the device's
stream (perf_counter off CUDA) at `on_step_begin`, `on_pre_optimizer_step`, `on_optimizer_step` and
`on_step_end`, read once the step has ended, so nothing is synchronized between a step's parts. Trainer copies
each batch to the device before `on_step_begin`, so the copy is outside the step as in the native loop. Under
fp16 the GradScaler's unscale and inf/NaN check run at `on_pre_optimizer_step`, before the optimizer-step mark
(a no-op when gradient clipping already unscaled): `optimizer.step()` is then timed without them, and a step
the scaler skips is recorded in `skipped_steps`, out of the medians and of `first_step_s`. After each step the
device's used memory is sampled (MemoryWindow.sample_device_used), outside the timed intervals.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from optbench.probes.timing import StepSamples, StepTimer
from optbench.records.record import Record


class OptbenchCallback(TrainerCallback):
    """Measure a Trainer run; with `results_path`, append its record there when training ends.

    `settings` are Record fields the callback cannot see from Trainer (`workload="reviews"`,
    `dataset=...`, `seq_len=128`): the report's headings and grouping use them. The optimizer is named by
    Trainer's `optim` when Trainer built it, else by `optimizer_name` (a registry name or an `optim` alias), else
    by its class; a known name also fills the state precision and the analytic state bytes. `record` lets a
    caller (optbench's `trainer` engine) fill its own record; the callback then only measures and leaves the
    describing and writing to the caller.
    """

    def __init__(self, results_path: str | Path | None = None, optimizer_name: str = "", warmup_steps: int = 5,
                 record: Record | None = None, **settings: Any) -> None:
        self.results_path = None if results_path is None else Path(results_path)
        self.warmup_steps = warmup_steps  # steps kept out of the medians (state creation, allocator warm-up)
        self.record = record if record is not None else Record(optimizer=optimizer_name, engine="trainer",
                                                               **settings)
        self.memory = None  # measure.MemoryWindow, opened at train begin
        self.samples = StepSamples(warmup_steps)
        self.diverged_at: int | None = None
        self.trained_s = 0.0  # every step's time, warm-up included (the x-axis of an eval curve)
        self._timer = None  # timing.StepTimer of the step in progress
        self._stepped = True  # whether the step in progress really ran optimizer.step()
        self._started = 0.0

    # -- timing ---------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        from optbench.probes.measure import MemoryWindow

        self.memory = MemoryWindow(args.device)
        self._started = time.perf_counter()

    def on_step_begin(self, args, state, control, **kwargs):
        self._timer = StepTimer(args.device)
        self._timer.mark("start")

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        from optbench.trial.precision import wrapped_step_will_run

        self._stepped = wrapped_step_will_run(optimizer)  # fp16: unscale and check outside optimizer.step()'s time
        self._timer.mark("backward")
        self._timer.mark("step")

    def on_optimizer_step(self, args, state, control, **kwargs):
        self._timer.mark("stepped")
        self._timer.mark("zero")  # Trainer's schedule and zero_grad come next

    def on_step_end(self, args, state, control, **kwargs):
        self._timer.mark("end")
        step_s, optimizer_s = self._timer.step_seconds()
        if self.memory is not None:
            self.memory.sample_device_used()
        self.trained_s += step_s
        # Trainer counts the step just finished
        self.samples.add(state.global_step - 1, step_s, optimizer_s, self._stepped)
        self._stepped = True

    # -- quality --------------------------------------------------------------------------------------
    def on_log(self, args, state, control, logs=None, **kwargs):
        loss = (logs or {}).get("loss")
        if loss is None:
            return
        self.record.loss_curve.append(float(loss))
        if not math.isfinite(loss) and self.diverged_at is None:
            self.diverged_at = state.global_step
            control.should_training_stop = True

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        """Trainer prefixes its metrics with `eval_`; the record keeps them unprefixed, like a trial's."""
        metrics = {k.removeprefix("eval_"): float(v) for k, v in (metrics or {}).items()
                   if isinstance(v, int | float) and k not in ("epoch",)}
        self.record.eval_metrics = metrics
        self.record.eval_accuracy = metrics.get("accuracy")
        self.record.eval_f1 = metrics.get("f1")

    # -- the record -----------------------------------------------------------------------------------
    def on_train_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        if self.results_path is None:
            return
        from optbench.records.record import append_record

        self.finish(args, state, model, optimizer)
        append_record(self.results_path, self.record)

    def finish(self, args, state, model, optimizer) -> Record:
        """Fill the record from a finished run: the settings Trainer knows, then sizes, state, peaks and speed the
        way a trial describes them (trial/describe.py), the environment and the status."""
        from optbench.records.environment import environment
        from optbench.trial.describe import describe_final_loss, describe_model, describe_training
        from optbench.trial.engines.base import EngineResult

        record = self.record
        record.device = str(args.device)
        record.steps, record.warmup_steps = state.global_step, self.warmup_steps
        record.batch_size = args.per_device_train_batch_size * max(1, args.gradient_accumulation_steps)
        record.lr, record.seed = args.learning_rate, args.seed
        record.wall_s = time.perf_counter() - self._started
        record.env = environment(args.device)
        if optimizer is not None:
            optimizer = getattr(optimizer, "optimizer", optimizer)  # Accelerate wraps Trainer's optimizer
            record.optimizer = _trained_with(record.optimizer, args, model, optimizer)
        entry = _registry_entry(record.optimizer)
        if model is not None:
            record.model = record.model or getattr(getattr(model, "config", None), "_name_or_path", "") or ""
            describe_model(record, model, entry)
        describe_training(record, EngineResult(memory=self.memory, samples=self.samples), optimizer, entry, model)
        describe_final_loss(record)
        if self.diverged_at is None:
            record.status, record.error = "ok", None
        else:
            record.status, record.error = "diverged", f"loss became non-finite at step {self.diverged_at}"
        return record


def _trained_with(named: str, args: Any, model: Any, optimizer: Any) -> str:
    """The optimizer's name on the record. Trainer's `optim` where the optimizer is of the class Trainer builds for
    it (the run's own setting: a name given to the callback that resolves to another entry is said in a warning
    and overruled); else the name given; else the optimizer's class (a user's own optimizer passed to Trainer)."""
    import warnings

    from transformers import Trainer

    optim = str(getattr(args.optim, "value", args.optim))
    try:
        built = isinstance(optimizer, Trainer.get_optimizer_cls_and_kwargs(args, model)[0])
    except Exception:  # noqa: BLE001 - naming must never cost the record: Trainer's answer is then unknown
        built = False
    if built and named and _registry_entry(named) is not _registry_entry(optim):
        warnings.warn(f"optbench: optimizer_name {named!r} is not what Trainer trained with (optim={optim!r}, "
                      f"{type(optimizer).__name__}): the record says {optim!r}", stacklevel=3)
        return optim
    return named or (optim if built else type(optimizer).__name__)


def _registry_entry(name: str):
    """The registry entry `name` names (registry names and Trainer's `optim` aliases), else None."""
    from optbench.optimizers import UnknownOptimizerError, resolve

    try:
        return resolve(name) if name else None
    except UnknownOptimizerError:
        return None
