"""Timing a train step the way a GPU needs: synchronized clocks, CUDA events, one rule for every engine's intervals.

CUDA kernels run asynchronously: `time.perf_counter()` around a launch measures the launch. A step is therefore
timed with CUDA events on the device's own stream and synchronized once, at its end (a synchronize between
backward and step() would serialize what a real loop overlaps); off CUDA the marks are perf_counter(). Every
engine marks the same STEP_MARKS and adds them up with `StepTimer.step_seconds`, and `step_role` says which
steps count, so native, Accelerate and Trainer timings measure the same interval.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: torch.device) -> float:
    """perf_counter() after the device has finished its queued work: the only honest CUDA timestamp."""
    synchronize(device)
    return time.perf_counter()


# The marks every engine makes in a train step, in this order. A step's time is three intervals: forward and
# backward (start-backward: under fp16 also GradScaler's unscale and its host-blocking inf check), optimizer.step()
# alone (step-stepped), zero_grad and the schedule (zero-end). The gaps between them hold untimed probes (update
# fidelity, RSS readings); the batch reaches the device before `start`. Engines that cannot put work in a gap
# mark its two ends back to back.
STEP_MARKS = ("start", "backward", "step", "stepped", "zero", "end")


class StepTimer:
    """Named timestamps within one train step, read as intervals once the step is done.

    On CUDA each mark records an event on the device's current stream (the stream the step's kernels queue on)
    and the first read synchronizes once, on the last event, so the device runs the step as an untimed loop would;
    on CPU marks are perf_counter().
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.marks: dict[str, torch.cuda.Event | float] = {}

    def mark(self, name: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            self.marks[name] = event
        else:
            self.marks[name] = time.perf_counter()

    def seconds(self, start: str, end: str) -> float:
        """Seconds between two marks; on CUDA the first call waits for the last recorded event."""
        first, last = self.marks[start], self.marks[end]
        if self.cuda:
            list(self.marks.values())[-1].synchronize()
            return first.elapsed_time(last) / 1e3
        return last - first

    def step_seconds(self) -> tuple[float, float]:
        """(step seconds, optimizer-step seconds) of a step marked with STEP_MARKS: the one way every engine adds
        up its step, so engine timings compare."""
        optimizer_s = self.seconds("step", "stepped")
        return self.seconds("start", "backward") + optimizer_s + self.seconds("zero", "end"), optimizer_s


def step_role(step: int, stepped: bool, warmup_steps: int, first_stepped: int | None) -> str:
    """What one step's time counts for, the same in every engine and the Trainer callback: `skipped` (a GradScaler
    skipped optimizer.step() on inf/NaN gradients: no optimizer work, no state made), `first` (the first step that
    stepped: lazy state creation, torchao's compile; reported as first_step_s), `warmup` (before `warmup_steps`) or
    `timed` (in the medians). `first_stepped`: the step that was `first` so far, None before it."""
    if not stepped:
        return "skipped"
    if first_stepped is None:
        return "first"
    return "timed" if step >= warmup_steps else "warmup"


@dataclass
class StepSamples:
    """The step times a loop keeps, sorted by `step_role`: the samples after warm-up, the first step that
    stepped apart, the skipped steps listed. Every engine and the Trainer callback keep theirs in one of these."""

    warmup_steps: int
    step_times: list[float] = field(default_factory=list)
    optimizer_times: list[float] = field(default_factory=list)
    timed_steps: list[int] = field(default_factory=list)  # the step index of each timed sample (--paired-probe)
    skipped_steps: list[int] = field(default_factory=list)
    first_step_s: float | None = None
    first_stepped: int | None = None

    def add(self, step: int, step_s: float, optimizer_s: float, stepped: bool = True) -> None:
        role = step_role(step, stepped, self.warmup_steps, self.first_stepped)
        if role == "first":
            self.first_stepped, self.first_step_s = step, step_s
        elif role == "timed":
            self.step_times.append(step_s)
            self.optimizer_times.append(optimizer_s)
            self.timed_steps.append(step)
        elif role == "skipped":
            self.skipped_steps.append(step)

    def fill(self, record: Any) -> None:
        """The record's `first_step_s` and `skipped_steps` (the samples themselves go through describe_speed)."""
        record.first_step_s, record.skipped_steps = self.first_step_s, list(self.skipped_steps)
