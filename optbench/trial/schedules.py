"""Learning-rate schedules: a linear warm-up, then one of four shapes to the end of the job.

- `linear` (the default): decay linearly to 0 at the last step, HF Trainer's default. The final weights then
  carry little of the last steps' noise (docs/study.md gives the seed spread measured with each schedule).
- `constant`: the warm-up's peak lr to the end (schema-1 records all ran this way).
- `cosine`: half a cosine from the peak to 0.
- `wsd` (warm-up, stable, decay): the peak lr until the last `WSD_DECAY_FRACTION` of the steps, then linear to 0.

`lr_factor` is the multiplier on the optimizer's lr before step `step` (0-based), so the first step runs at
1/warmup of the peak and the last step at a small positive lr; it is pure so tests and the report can use it.
"""

from __future__ import annotations

import math
from typing import Any

from optbench.job.spec import SCHEDULES

WSD_DECAY_FRACTION = 0.2  # the decay phase of wsd: the last fifth of the steps, as its authors' runs use


def lr_factor(schedule: str, step: int, steps: int, warmup_steps: int) -> float:
    """The lr multiplier for 0-based `step` of a `steps`-step job with `warmup_steps` of linear warm-up."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule '{schedule}'; known: {', '.join(SCHEDULES)}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, steps - warmup_steps)
    done = (step - warmup_steps) / span  # 0 at the first step after warm-up, < 1 at the last
    if schedule == "linear":
        return 1.0 - done
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * done))
    decay_start = 1.0 - WSD_DECAY_FRACTION
    return 1.0 if done < decay_start else (1.0 - done) / WSD_DECAY_FRACTION


def make_scheduler(optimizer: Any, schedule: str, steps: int, warmup_steps: int) -> Any:
    """A torch LambdaLR driving `optimizer` along `lr_factor` (stepped once per optimizer step)."""
    import torch

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(schedule, step, steps, warmup_steps))
