"""transformers' Adafactor, without and with momentum.

It computes in fp32 whatever the parameter dtype (it upcasts bf16 gradients), so all its state is fp32:
a factored second moment (row + column statistics) for tensors of rank >= 2, a full one for vectors,
a full first moment when beta1 is set, and a 0-d `RMS` tensor per parameter (`step` is a Python int).
"""

from __future__ import annotations

from typing import Any

from optbench.optimizers.base import FP32_BYTES, Count, OptimizerSpec, Param, total

# Without momentum or parameter scaling Adafactor's update is RMS-clipped to ~lr per element, so it
# wants a larger lr than AdamW for the same progress.
ADAFACTOR_LR, ADAFACTOR_LR_RANGE = 3e-4, (3e-5, 3e-3)


def _adafactor_count(params: list[Param], beta1: float | None = None, **_: Any) -> Count:
    counts = []
    for p in params:
        if len(p.shape) >= 2:
            rows, cols = p.numel // p.shape[-1], p.numel // p.shape[-2]
            second = Count(FP32_BYTES * (rows + cols))
        else:
            second = Count(FP32_BYTES * p.numel, p.numel)
        first = Count(FP32_BYTES * p.numel) if beta1 is not None else Count()
        counts.append(second + first + Count(FP32_BYTES))
    return total(counts)


def _make_adafactor(params: Any, lr: float, **kwargs: Any) -> Any:
    from transformers.optimization import Adafactor

    return Adafactor(params, lr=lr, **kwargs)


# An external learning rate (as a scheduler would drive it), no relative-step heuristics: the
# configuration people pick Adafactor for when they fine-tune with a schedule.
_EXTERNAL_LR = {"relative_step": False, "scale_parameter": False, "warmup_init": False}

TRANSFORMERS_ENTRIES = [
    OptimizerSpec(
        name="adafactor", hf_alias="adafactor", aliases=("adafactor_hf",), factory=_make_adafactor,
        library="transformers", default_lr=ADAFACTOR_LR, lr_range=ADAFACTOR_LR_RANGE, precision="factored",
        count=_adafactor_count, default_kwargs={**_EXTERNAL_LR, "beta1": None},
        description="transformers Adafactor, external lr, no momentum: row+column second moment",
    ),
    OptimizerSpec(
        name="adafactor_momentum", factory=_make_adafactor, library="transformers",
        default_lr=ADAFACTOR_LR, lr_range=ADAFACTOR_LR_RANGE, precision="factored+fp32-momentum",
        count=_adafactor_count, default_kwargs={**_EXTERNAL_LR, "beta1": 0.9},
        description="transformers Adafactor with beta1=0.9: adds a full fp32 first moment",
    ),
]
