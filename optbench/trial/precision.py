"""Training precision: what the weights are stored in, and what the forward pass computes in.

- `fp32`: fp32 weights, gradients and compute.
- `bf16-autocast` / `fp16-autocast`: fp32 weights (the master copy), forward under `torch.autocast`;
  fp16 on CUDA also scales the loss (GradScaler), since fp16 gradients underflow without it. The scaler's
  unscale and inf/NaN check run before the optimizer-step interval (`unscale_and_check`), so optimizer.step()
  is timed alone in every precision; a step it skips is recorded as skipped.
- `bf16`: bf16 weights and gradients, no fp32 master copy — the regime low-bit optimizers are often paired
  with; state dtypes then follow the parameters for optimizers that allocate `zeros_like(param)`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from optbench.job.spec import PRECISIONS


@dataclass(frozen=True)
class Precision:
    name: str
    param_dtype: torch.dtype
    autocast_dtype: torch.dtype | None

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.autocast_dtype)

    def grad_scaler(self, device: torch.device) -> torch.amp.GradScaler | None:
        """A loss scaler for fp16 autocast on CUDA; None elsewhere (bf16 keeps fp32's exponent range)."""
        if self.autocast_dtype == torch.float16 and device.type == "cuda":
            return torch.amp.GradScaler("cuda")
        return None


def parse_precision(name: str) -> Precision:
    dtypes = {"fp32": (torch.float32, None), "bf16-autocast": (torch.float32, torch.bfloat16),
              "fp16-autocast": (torch.float32, torch.float16), "bf16": (torch.bfloat16, None)}
    if name not in dtypes:
        raise ValueError(f"unknown precision '{name}'; known: {', '.join(PRECISIONS)}")
    return Precision(name, *dtypes[name])


def unscale_and_check(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> bool:
    """Unscale `optimizer`'s gradients (unless done already this step, e.g. by gradient clipping) and read the
    scaler's inf/NaN check, which waits for the backward pass on the host: whether optimizer.step() will run.

    Done before the optimizer-step mark, so that interval holds optimizer.step() alone; `scaler.step` afterwards
    finds the gradients unscaled (or the caller steps the optimizer itself) and `scaler.update` works as usual.
    A disabled scaler records no check: the step runs."""
    found = scaler._found_inf_per_device(optimizer)  # filled by unscale_; torch's own fused optimizers read it too
    if not found:
        scaler.unscale_(optimizer)
        found = scaler._found_inf_per_device(optimizer)
    return not any(flag.item() for flag in found.values())


def wrapped_step_will_run(optimizer: Any) -> bool:
    """`unscale_and_check` for an optimizer wrapped together with its scaler (Accelerate's AcceleratedOptimizer,
    which Trainer uses too: `.scaler`, `.optimizer`); True where there is no scaler."""
    scaler = getattr(optimizer, "scaler", None)
    return True if scaler is None else unscale_and_check(scaler, optimizer.optimizer)
