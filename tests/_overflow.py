"""A forced fp16-style overflow for CPU tests: a loss whose value is untouched but whose gradient is inf, so a
GradScaler (torch.amp.GradScaler("cpu")) finds inf gradients and skips the step exactly where a test says."""

from __future__ import annotations

import torch


class InfGradient(torch.autograd.Function):
    """Identity forward; backward hands every upstream tensor an inf gradient."""

    @staticmethod
    def forward(ctx, loss: torch.Tensor) -> torch.Tensor:
        return loss.view_as(loss)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return torch.full_like(grad, float("inf"))


def overflowing(loss: torch.Tensor) -> torch.Tensor:
    """`loss`, with an inf gradient on the way back."""
    return InfGradient.apply(loss)


def overflow_at(monkeypatch, steps: set[int], cpu_scaler: bool = False) -> None:
    """Make the tiny workload's training loss overflow at these training steps (the untimed warm-up pass is not
    one; evaluations, run without gradients, are left alone). `cpu_scaler`: give CPU fp16 trials a GradScaler, as
    CUDA ones get (torch 2.13 has torch.amp.GradScaler("cpu"); optbench's trials make one on CUDA only)."""
    from optbench.trial.precision import Precision
    from optbench.workloads import get_workload

    if cpu_scaler:
        monkeypatch.setattr(Precision, "grad_scaler", lambda self, device: torch.amp.GradScaler(device.type))
    workload_type, calls = type(get_workload("tiny")), []
    loss = workload_type.loss

    def overflowing_loss(self, model, batch):
        value = loss(self, model, batch)
        if not torch.is_grad_enabled():
            return value
        calls.append(1)
        return overflowing(value) if len(calls) - 2 in steps else value

    monkeypatch.setattr(workload_type, "loss", overflowing_loss)
