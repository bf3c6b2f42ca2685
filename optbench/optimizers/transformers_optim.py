"""transformers' Adafactor, without and with momentum.

It computes in fp32 whatever the parameter dtype (it upcasts bf16 gradients), so all its state is fp32:
a factored second moment (row + column statistics) for tensors of rank >= 2, a full one for vectors,
a full first moment when beta1 is set, and a 0-d `RMS` tensor per parameter (`step` is a Python int).
"""

from __future__ import annotations

from typing import Any

from optbench.optimizers.base import FP32, FP32_BYTES, OptimizerSpec, Param, ParamState, param_state
from optbench.optimizers.torch_optim import factored_or_full

# Without momentum or parameter scaling Adafactor's update is RMS-clipped to ~lr per element, so it
# wants a larger lr than AdamW for the same progress.
ADAFACTOR_LR, ADAFACTOR_LR_RANGE = 3e-4, (3e-5, 3e-3)


def adafactor_rule(p: Param, beta1: float | None = None, **_: Any) -> ParamState:
    # A vector's full second moment is its full-size fp32 state; a first moment beside a factored second
    # one is not counted as such (the entry still compresses the bigger statistic). Plus a 0-d fp32 `RMS`.
    second, why = factored_or_full(p, FP32, FP32_BYTES)
    first = (FP32, FP32_BYTES * p.numel if beta1 is not None else 0)
    why += " + momentum" if beta1 is not None else ""
    return param_state(why, second, first, (FP32, FP32_BYTES), fp32_state_numel=p.numel if len(p.shape) < 2 else 0)


def _make_adafactor(params: Any, lr: float, **kwargs: Any) -> Any:
    from transformers.optimization import Adafactor

    return Adafactor(params, lr=lr, **kwargs)


# An external learning rate (as a scheduler would drive it), no relative-step heuristics: the
# configuration people pick Adafactor for when they fine-tune with a schedule.
_EXTERNAL_LR = {"relative_step": False, "scale_parameter": False, "warmup_init": False}
NO_DTENSOR = ("transformers' Adafactor mixes plain tensors with the DTensor parameters in its update "
              "('aten.add_.Tensor got mixed torch.Tensor and DTensor')")

TRANSFORMERS_ENTRIES = [
    OptimizerSpec(
        name="adafactor", hf_alias="adafactor", aliases=("adafactor_hf",), factory=_make_adafactor,
        library="transformers", default_lr=ADAFACTOR_LR, lr_range=ADAFACTOR_LR_RANGE, precision="factored",
        rule=adafactor_rule, default_kwargs={**_EXTERNAL_LR, "beta1": None}, fsdp2=NO_DTENSOR,
        description="transformers Adafactor, external lr, no momentum: row+column second moment",
    ),
    OptimizerSpec(
        name="adafactor_momentum", factory=_make_adafactor, library="transformers",
        default_lr=ADAFACTOR_LR, lr_range=ADAFACTOR_LR_RANGE, precision="factored+fp32-momentum",
        rule=adafactor_rule, default_kwargs={**_EXTERNAL_LR, "beta1": 0.9}, fsdp2=NO_DTENSOR,
        description="transformers Adafactor with beta1=0.9: adds a full fp32 first moment",
    ),
]
