"""`--paired-probe`: the stream kernel timed right after every optimizer step, so that each step's bandwidth is read
against what the machine streamed at that moment rather than against a ceiling measured at another one.

Why: on the shared 2-core hosts the same fused AdamW step, divided by one calibrated ceiling, spread ±2.3 % over
five trials on one morning and ±18.1 % on another day and host (README, roofline %): the machine's speed moves over
seconds and minutes, between processes and within one (scripts/step_drift_probe.py), and no ceiling taken at
another moment follows it. A pass of the stream kernel (optbench/probes/stream.py: torch's fused AdamW update over
four fp32 operands) milliseconds after each step sees the machine the step saw. Its operands are the size of the
model's trainable weights, so the pass streams the working set a fused AdamW step of this model streams.

The paired share of a step is its analytic traffic over its optimizer-step time, over the pass's bandwidth; a
trial's figure is the median over its timed steps. It says how close the step comes to the fused kernel at that
moment, not to the machine's peak (the calibrated roofline's question).

The operands are allocated before the memory baseline and nothing is allocated per pass (the update is in place),
so the training-memory figures (growth over the baseline) do not carry them; the process's absolute peaks do.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

import torch

from optbench.probes.stream import FP32_BYTES, StreamKernel

if TYPE_CHECKING:
    from optbench.probes.timing import StepSamples


class PairedStream:
    """The stream kernel (probes/stream.py StreamKernel) over operands of `operand_bytes` each, one pass timed
    after each stepped step."""

    def __init__(self, device: torch.device, operand_bytes: int) -> None:
        self.kernel = StreamKernel(device, operand_bytes)
        self.bytes_per_s: dict[int, float] = {}

    @classmethod
    def for_model(cls, model: torch.nn.Module, device: torch.device) -> PairedStream:
        """Operands the size of the model's trainable weights, in fp32 (what a fused AdamW step of it streams)."""
        numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
        return cls(device, numel * FP32_BYTES)

    def after_step(self, step: int) -> None:
        """Time one pass, right after step `step`'s optimizer step (outside the step's timed intervals)."""
        seconds = self.kernel.pass_seconds()
        if seconds > 0:
            self.bytes_per_s[step] = self.kernel.moved_bytes / seconds

    def paired(self, samples: StepSamples, traffic_bytes: int | None) -> tuple[list[float], float | None]:
        """(the pass's bandwidth after each timed step, in the samples' order; the median over those steps of the
        step's bandwidth by its analytic traffic over the pass's), the share None without a traffic count."""
        passes = [self.bytes_per_s.get(step) for step in samples.timed_steps]
        shares = [traffic_bytes / step_s / bandwidth
                  for step_s, bandwidth in zip(samples.optimizer_times, passes, strict=True)
                  if traffic_bytes and bandwidth and step_s > 0]
        return [b for b in passes if b is not None], statistics.median(shares) if shares else None
