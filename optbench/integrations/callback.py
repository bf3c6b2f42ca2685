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

Timing on CUDA synchronizes at `on_step_begin`, around `optimizer.step()` and at `on_step_end`: the
device work of a step is then inside its interval, at the cost of a host wait per boundary (tens of
microseconds each, plus the lost overlap between one step's tail and the next step's launch; about 1 %
on steps of tens of milliseconds, more on very short steps). Off CUDA nothing is synchronized.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from optbench.results import Record


class OptbenchCallback(TrainerCallback):
    """Measure a Trainer run; with `results_path`, append its record there when training ends.

    `settings` are Record fields the callback cannot see from Trainer (`workload="reviews"`,
    `dataset=...`, `seq_len=128`): the report's headings and grouping use them. `optimizer_name` may be a
    registry name or Trainer's `optim` alias; a known one also fills the state precision and the
    analytic state bytes. `record` lets a caller (optbench's `trainer` engine) fill its own record; the
    callback then only measures and leaves the describing and writing to the caller.
    """

    def __init__(self, results_path: str | Path | None = None, optimizer_name: str = "", warmup_steps: int = 5,
                 record: Record | None = None, **settings: Any) -> None:
        self.results_path = None if results_path is None else Path(results_path)
        self.warmup_steps = warmup_steps  # steps kept out of the medians (state creation, allocator warm-up)
        self.record = record if record is not None else Record(optimizer=optimizer_name, engine="trainer",
                                                               **settings)
        self.memory = None  # measure.MemoryWindow, opened at train begin
        self.step_times: list[float] = []
        self.optimizer_times: list[float] = []
        self.diverged_at: int | None = None
        self.trained_s = 0.0  # every step's time, warm-up included (the x-axis of an eval curve)
        self._marks: dict[str, float] = {}
        self._started = 0.0

    # -- timing ---------------------------------------------------------------------------------------
    def _now(self, args) -> float:
        from optbench.measure import clock

        return clock(args.device)

    def on_train_begin(self, args, state, control, **kwargs):
        from optbench.measure import MemoryWindow

        self.memory = MemoryWindow(args.device)
        self._started = time.perf_counter()

    def on_step_begin(self, args, state, control, **kwargs):
        self._marks = {"start": self._now(args)}

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._marks["step"] = self._now(args)

    def on_optimizer_step(self, args, state, control, **kwargs):
        self._marks["stepped"] = self._now(args)

    def on_step_end(self, args, state, control, **kwargs):
        marks = self._marks
        step_s = self._now(args) - marks["start"]
        step = state.global_step - 1  # Trainer counts the step just finished
        self.trained_s += step_s
        if step == 0:
            self.record.first_step_s = step_s
        elif step >= self.warmup_steps:
            self.step_times.append(step_s)
            if "step" in marks and "stepped" in marks:
                self.optimizer_times.append(marks["stepped"] - marks["step"])

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
        from optbench.results import append_record

        self.finish(args, state, model, optimizer)
        append_record(self.results_path, self.record)

    def finish(self, args, state, model, optimizer) -> Record:
        """Fill the record from a finished run: settings, sizes, state, peaks, speed, environment, status."""
        from optbench import measure
        from optbench.environment import environment
        from optbench.results import split_peak_memory

        record = self.record
        record.device = str(args.device)
        record.steps, record.warmup_steps = state.global_step, self.warmup_steps
        record.batch_size = args.per_device_train_batch_size * max(1, args.gradient_accumulation_steps)
        record.lr, record.seed = args.learning_rate, args.seed
        record.wall_s = time.perf_counter() - self._started
        record.env = environment()
        if model is not None:
            params = [p for p in model.parameters() if p.requires_grad]
            record.model = record.model or getattr(getattr(model, "config", None), "_name_or_path", "") or ""
            record.num_params = sum(p.numel() for p in params)
            record.weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
            record.grads_bytes = sum(p.numel() * p.element_size() for p in params)
        entry = _registry_entry(record.optimizer)
        if entry is not None and model is not None:
            record.state_precision = record.state_precision or entry.precision
            record.analytic_state_bytes = entry.analytic_for(model).state_bytes
        if optimizer is not None:
            optimizer = getattr(optimizer, "optimizer", optimizer)  # Accelerate wraps Trainer's optimizer
            record.optimizer = record.optimizer or type(optimizer).__name__
            record.state_bytes, record.state_bytes_by_key = measure.optimizer_state_bytes(optimizer)
            if record.num_params:
                record.state_bytes_per_param = record.state_bytes / record.num_params
        if self.memory is not None:
            self.memory.fill(record)
            split_peak_memory(record)
        measure.describe_speed(record, self.step_times, self.optimizer_times)
        if record.loss_curve:
            tail = record.loss_curve[-5:]
            record.train_loss_final = sum(tail) / len(tail)
        if self.diverged_at is None:
            record.status, record.error = "ok", None
        else:
            record.status, record.error = "diverged", f"loss became non-finite at step {self.diverged_at}"
        return record


def _registry_entry(name: str):
    """The registry entry `name` names (registry names and Trainer's `optim` aliases), else None."""
    from optbench.optimizers import UnknownOptimizerError, resolve

    try:
        return resolve(name) if name else None
    except UnknownOptimizerError:
        return None
