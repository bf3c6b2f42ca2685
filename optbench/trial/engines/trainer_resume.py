"""`--resume-check --engine trainer`: does the optimizer survive Trainer's own checkpoint and `resume_from_checkpoint`?

What most fine-tuning jobs do when they are interrupted: Trainer writes `checkpoint-<step>` (the model's
safetensors, `optimizer.pt`, `scheduler.pt`, the RNG states, `trainer_state.json`) and a new `Trainer.train(
resume_from_checkpoint=...)` loads it — the optimizer with `torch.load(..., weights_only=True)` — fast-forwards
the data loader past the batches already trained and goes on. The uninterrupted trial saves at its middle step
through Trainer's own `_save_checkpoint` (outside the timed intervals and the memory window's peak) and trains on
as the reference; then freshly built objects resume from that folder in a second Trainer, and their final
parameters and last loss are compared with the reference's, with the native check's words (`resume.compare`).

A save that fails is a result (the library's message), and the reference run goes on without a checkpoint; so is
a resume that fails. Schedule-free AdamW is switched to `eval()` for the save, as its authors document; Trainer
itself switches it back to `train()` at every training step, the resumed run's first included.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from optbench.records.record import Record
from optbench.trial.engines.base import Setup
from optbench.trial.engines.resume import FAILURES, _message, _params, compare, middle_step, switches_mode, timed_save


class LastLoss(TrainerCallback):
    """The resumed run's load time (from `train()` to `on_train_begin`: weights, optimizer and schedule loaded)
    and its last logged loss."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.load_s: float | None = None
        self.loss: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.load_s = time.perf_counter() - self.started

    def on_log(self, args, state, control, logs=None, **kwargs):
        if (logs or {}).get("loss") is not None:
            self.loss = float(logs["loss"])


class TrainerResumeCheck:
    """Saves through the reference Trainer at the middle step (`save`), then `finish` resumes and compares.
    `build_trainer(setup, output_dir, callbacks)` makes the resumed run's Trainer: the trainer engine hands its own,
    so this module never imports the engine that uses it."""

    def __init__(self, s: Setup, record: Record, build_trainer: Callable[..., Any]) -> None:
        self.s, self.record, self.build_trainer = s, record, build_trainer
        self.mid = middle_step(s.spec.steps)
        self.folder = tempfile.TemporaryDirectory(prefix="optbench-trainer-resume-")
        self.error: str | None = None
        if switches_mode(s):
            record.resume_note = "optimizer.eval() before Trainer saves; Trainer calls optimizer.train() each step"

    @property
    def output_dir(self) -> str:
        """The reference Trainer's output folder: its checkpoint must outlive its `train()`."""
        return self.folder.name

    @property
    def checkpoint(self) -> Path:
        return Path(self.folder.name) / f"checkpoint-{self.mid}"

    def arguments(self) -> dict[str, Any]:
        """What the reference Trainer's TrainingArguments add: a checkpoint at the middle step."""
        return {"save_strategy": "steps", "save_steps": self.mid}

    def save(self, write: Callable[[], None]) -> None:
        """The reference run's `_save_checkpoint` at the middle step: timed, the mode switch around it, a failure
        kept as the result."""
        try:
            timed_save(self.s, self.record, self.checkpoint, write)
        except FAILURES as exc:
            self.error = _message(exc)

    def finish(self, fresh: Setup) -> None:
        """Resume `fresh` (new objects from the same spec) from the checkpoint in a second Trainer, compare."""
        try:
            if self.error is None:
                self._resume(fresh)
        except FAILURES as exc:
            self.error = _message(exc)
        finally:
            self.folder.cleanup()
        if self.error is not None:
            self.record.resume_status = f"error: {self.error}"

    def _resume(self, fresh: Setup) -> None:
        if not self.checkpoint.is_dir():
            raise RuntimeError(f"Trainer wrote no {self.checkpoint.name}")
        probe = LastLoss()
        with tempfile.TemporaryDirectory(prefix="optbench-trainer-") as output_dir:
            trainer = self.build_trainer(fresh, output_dir, [probe])
            probe.started = time.perf_counter()
            trainer.train(resume_from_checkpoint=str(self.checkpoint))
        if probe.loss is None:
            raise RuntimeError("the resumed Trainer logged no loss")
        self.record.checkpoint_load_s = probe.load_s
        compare(self.record, _params(self.s.model), _params(fresh.model), self.record.loss_curve[-1], probe.loss)
