"""Update fidelity: how far an optimizer's parameter update is from the one fp32 AdamW would make.

Eval accuracy after a short job is a noisy, indirect read of what low-precision or factored state
costs. This probe measures the cost where it arises: at every step a shadow fp32 `torch.optim.AdamW`
gets the *same gradients* and starts from the *same parameters* (the real ones are copied into it just
before its step), so the two trajectories never drift apart and each step compares like with like.
The shadow's moments still accumulate over the run from those gradients, as the real optimizer's do.

Per step, over all parameters flattened into one vector:
    cosine    = <u, u_ref> / (||u|| ||u_ref||)
    rel_error = ||u - u_ref|| / ||u_ref||
where u = params after step() - params before, and u_ref the shadow's update. For `adamw` itself the two
are the same computation, so cosine is 1 and the error 0: the probe's own zero point.

Under fp16 the probe runs after the GradScaler has unscaled the gradients and checked them, so the shadow
steps on the gradients the real optimizer sees; a step the scaler skips (inf/NaN gradients) is skipped by
the shadow too and has no reading (None), so one overflow cannot leave the shadow's moments NaN.

The shadow holds an fp32 copy of the parameters, two fp32 moments and a snapshot of the parameters,
so a fidelity trial's memory readings are inflated; the record says `fidelity=True`.
"""

from __future__ import annotations

import math
import numbers
import statistics
from typing import Any

import torch


def reference_settings(group: dict[str, Any]) -> dict[str, Any]:
    """AdamW settings mirroring a param group: its lr, and its weight decay, betas and eps where it has
    AdamW-shaped ones (Adafactor's eps is a pair and it has no betas: those keep AdamW's defaults)."""
    settings: dict[str, Any] = {"lr": float(group["lr"])}
    if isinstance(group.get("weight_decay"), numbers.Real):
        settings["weight_decay"] = float(group["weight_decay"])
    betas = group.get("betas")
    if isinstance(betas, (tuple, list)) and len(betas) == 2 and all(isinstance(b, numbers.Real) for b in betas):
        settings["betas"] = (float(betas[0]), float(betas[1]))
    if isinstance(group.get("eps"), numbers.Real):
        settings["eps"] = float(group["eps"])
    return settings


class UpdateFidelity:
    """Shadow fp32 AdamW beside `optimizer`; call `before_step()` and `after_step()` around its step()."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = optimizer
        self._params: list[torch.Tensor] = [p for g in optimizer.param_groups for p in g["params"]]
        # Allocated once and reused: the snapshot of the parameters before the step, and the shadow's
        # parameters, which hold u_ref between before_step() and after_step(). Filled (not empty_like)
        # so their pages are resident now, in a baseline taken after this, not faulted in mid-training.
        self._before = [p.detach().to(torch.float32, copy=True) for p in self._params]
        self._shadow_params = [p.detach().to(torch.float32, copy=True) for p in self._params]
        shadow_groups, start = [], 0
        for group in optimizer.param_groups:
            count = len(group["params"])
            shadow_groups.append({"params": self._shadow_params[start: start + count],
                                  **reference_settings(group)})
            start += count
        self.shadow = torch.optim.AdamW(shadow_groups)
        self.cosines: list[float | None] = []
        self.rel_errors: list[float | None] = []
        self._skipping = False

    @torch.no_grad()
    def before_step(self, skip: bool = False) -> None:
        """Snapshot the parameters and take the shadow's step from them with the current (unscaled) gradients;
        `skip`: the real optimizer.step() will not run (a GradScaler found inf/NaN), so neither does the shadow's."""
        self._skipping = skip
        if skip:
            return
        for group, shadow_group in zip(self._optimizer.param_groups, self.shadow.param_groups, strict=True):
            shadow_group["lr"] = float(group["lr"])  # follow the scheduler
        for param, before, shadow in zip(self._params, self._before, self._shadow_params, strict=True):
            before.copy_(param)
            shadow.copy_(before)
            # AdamW reads gradients without writing them, so an fp32 gradient is shared, not copied.
            shadow.grad = None if param.grad is None else param.grad.to(torch.float32)
        self.shadow.step()
        for before, shadow in zip(self._before, self._shadow_params, strict=True):
            shadow.sub_(before)  # now u_ref
            shadow.grad = None  # do not keep the gradient alive past the real optimizer's zero_grad

    @torch.no_grad()
    def after_step(self) -> tuple[float | None, float | None]:
        """Compare the update the real optimizer just made with u_ref; append and return (cosine, rel error)."""
        if self._skipping:  # no step, no update to compare
            self.cosines.append(None)
            self.rel_errors.append(None)
            return None, None
        dot = norm_u = norm_ref = norm_diff = 0.0
        for param, before, ref in zip(self._params, self._before, self._shadow_params, strict=True):
            update = param.to(torch.float32) - before
            dot += (update * ref).sum(dtype=torch.float64).item()
            norm_u += (update * update).sum(dtype=torch.float64).item()
            norm_ref += (ref * ref).sum(dtype=torch.float64).item()
            update.sub_(ref)
            norm_diff += (update * update).sum(dtype=torch.float64).item()
        # No reference update (zero lr, zero gradients): nothing to compare against, so no reading.
        cosine = dot / math.sqrt(norm_u * norm_ref) if norm_u > 0 and norm_ref > 0 else None
        rel_error = math.sqrt(norm_diff / norm_ref) if norm_ref > 0 else None
        self.cosines.append(cosine)
        self.rel_errors.append(rel_error)
        return cosine, rel_error


def median_of(values: list[float | None]) -> float | None:
    """Median over the steps that have a reading."""
    present = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(present) if present else None
