"""Entries whose library comes with an optbench extra (`pip install "optbench[<extra>]"`, or `optbench[all]`):
schedule-free AdamW, RAdam and SGD, CAME, Adam-mini, GrokAdamW, StableAdamW (torch-optimi), LOMO and AdaLomo, and
HF's AnyPrecisionAdamW, whose library is not on PyPI. (torchao: torchao_optim.py; GaLore and APOLLO: low_rank.py.)

HF Trainer's names among them take Trainer's settings (optimizers/hf.py). LOMO has no optimizer.step(): it updates
each parameter from its gradient hook inside `fused_backward(loss, lr)`, which only Trainer's training step calls
(told `optim="lomo"`), so it trains under the trainer engine only.
"""

from __future__ import annotations

import functools
from typing import Any

from optbench.optimizers.base import (
    FP32,
    FP32_BYTES,
    OptimizerSpec,
    Param,
    ParamState,
    factored_numel,
    full_moments,
    param_state,
)
from optbench.optimizers.hf import HF_ADAM, HF_WEIGHT_DECAY, trainer_groups
from optbench.optimizers.torch_optim import ADAMW_LR_RANGE, adamw_rule

# ---- schedule-free: needs train()/eval() switching around evaluation ----


def _schedulefree_factory(class_name: str):
    def make(params: Any, lr: float, **kwargs: Any) -> Any:
        import schedulefree

        optimizer = getattr(schedulefree, class_name)(params, lr=lr, **kwargs)
        optimizer.train()  # it refuses to step in eval mode, and starts in it
        return optimizer

    return make


def _schedulefree_rule(moments: int, what: str):
    """z (the averaged iterate's base sequence) and, for Adam-like ones, exp_avg_sq: in the parameter's dtype."""

    def rule(p: Param, **_: Any) -> ParamState:
        return full_moments(p, moments, f"full: {what}")

    return rule


def _schedulefree_entry(name: str, class_name: str, rule: Any, **fields: Any) -> OptimizerSpec:
    # No decay schedule to lean on: the authors advise 1-10x AdamW's lr (and a warm-up).
    return OptimizerSpec(
        name=name, factory=_schedulefree_factory(class_name), library="schedulefree", extra="schedulefree",
        precision="fp32", rule=rule, before_eval=lambda optimizer: optimizer.eval(),
        after_eval=lambda optimizer: optimizer.train(), **{"default_lr": 1e-4, "lr_range": (1e-5, 1e-3), **fields})


# Trainer: Adam settings (not for SGD), weight decay, warm-up steps (0; not for RAdam), weight_lr_power 2, r 0.
_SCHEDULEFREE = {"weight_decay": HF_WEIGHT_DECAY, "weight_lr_power": 2.0, "r": 0.0}


# ---- GrokAdamW: keeps its state inside the param groups ----


@functools.cache
def _exposing_grok_state() -> type:
    """GrokAdamW keeps each parameter's state in `param_groups[i]["state"]`, where the state probe does not look;
    this subclass points `self.state[p]` at the same dicts after every step (no copy). Built on first use."""
    from grokadamw import GrokAdamW

    class ExposingGrokState(GrokAdamW):
        def step(self, *args: Any, **kwargs: Any) -> Any:
            loss = super().step(*args, **kwargs)
            for group in self.param_groups:
                self.state.update(group.get("state", {}))
            return loss

    ExposingGrokState.__name__ = ExposingGrokState.__qualname__ = "GrokAdamW"
    return ExposingGrokState


def _make_grokadamw(pairs: list[tuple[Param, Any]], lr: float, **kwargs: Any) -> Any:
    """In Trainer's two groups: GrokAdamW damps beta1 by a parameter's index within its group."""
    return _exposing_grok_state()(trainer_groups(pairs), lr=lr, **kwargs)


def _grokadamw_rule(p: Param, **_: Any) -> ParamState:
    # exp_avg, exp_avg_sq and the grokking EMA, each like the parameter (kept on the CPU between steps); an int step.
    return full_moments(p, 3, "full: 2 moments + grok EMA")


# ---- StableAdamW (torch-optimi) ----


def _make_stable_adamw(params: Any, lr: float, **kwargs: Any) -> Any:
    """torch-optimi 0.3.3 decides Triton before it has gathered the step's parameters (`all([])` is True), so with
    Triton installed (every CUDA build of torch has it) it takes its Triton kernel for CPU tensors too, which has no
    driver there: off the GPU, Triton is turned off unless asked for."""
    from optimi import StableAdamW

    params = list(params)
    tensors = [t for item in params for t in (item["params"] if isinstance(item, dict) else [item])]
    if not any(t.is_cuda for t in tensors):
        kwargs.setdefault("triton", False)
    return StableAdamW(params, lr=lr, **kwargs)


def _stable_adamw_rule(p: Param, kahan_sum: bool | None = None, **_: Any) -> ParamState:
    # Two moments and a 0-d eps^2, in the parameter's dtype; for bf16/fp16 parameters (kahan_sum None or True) a
    # Kahan compensation buffer like the parameter. Its step counter is a tensor in the param group, not the state.
    kahan = (kahan_sum or kahan_sum is None) and p.itemsize == 2
    return full_moments(p, 3 if kahan else 2, "full: 2 moments + Kahan buffer" if kahan else "full: 2 moments",
                        (p.dtype_name, p.itemsize))


# ---- LOMO and AdaLomo: fused updates inside backward ----


class _Named:
    """The module interface LOMO reads (named_parameters, parameters), over a registry factory's (facts, tensor)
    pairs."""

    def __init__(self, pairs: list[tuple[Param, Any]]) -> None:
        self.pairs = pairs

    def named_parameters(self) -> Any:
        return iter([(facts.name, tensor) for facts, tensor in self.pairs])

    def parameters(self) -> Any:
        return iter([tensor for _, tensor in self.pairs])


def _lomo_factory(class_name: str):
    def make(pairs: list[tuple[Param, Any]], lr: float, **kwargs: Any) -> Any:
        import lomo_optim

        return getattr(lomo_optim, class_name)(_Named(pairs), lr=lr, **kwargs)

    return make


def _lomo_rule(p: Param, **_: Any) -> ParamState:
    return param_state("none: SGD applied in the gradient hook")


def _adalomo_rule(p: Param, **_: Any) -> ParamState:
    # AdaLomo's factored fp32 second moment (rows + columns of a matrix, full for a vector), kept in dicts on the
    # optimizer rather than in its state (from its source; it runs on CUDA only, so not measured here).
    if len(p.shape) == 2:
        return param_state("factored (rows + cols)", (FP32, FP32_BYTES * sum(p.shape)))
    return param_state("full (vector)", (FP32, FP32_BYTES * p.numel), fp32_state_numel=p.numel)


# ---- CAME: confidence-guided factored Adam ----


def _came_rule(p: Param, **_: Any) -> ParamState:
    # Computes in fp32: a full fp32 first moment; for rank >= 2 factored second moment and factored
    # residual (row + column each); for vectors a full fp32 second moment; a 0-d RMS in the param dtype.
    rms = (p.dtype_name, p.itemsize)
    if len(p.shape) >= 2:
        return param_state("factored + fp32 momentum", (FP32, FP32_BYTES * (p.numel + 2 * factored_numel([p.shape]))),
                           rms)
    return param_state("full (vector)", (FP32, 2 * FP32_BYTES * p.numel), rms, fp32_state_numel=p.numel)


def _make_came(params: Any, lr: float, **kwargs: Any) -> Any:
    from came_pytorch import CAME

    return CAME(params, lr=lr, **kwargs)


def _adam_mini_rule(p: Param, **_: Any) -> ParamState:
    # Adam-mini's design (paper, not measured: the entry cannot run on BERT): a full fp32 first moment and
    # one fp32 second-moment value per output row of a matrix, one per vector.
    rows = p.shape[0] if len(p.shape) >= 2 else 1
    return param_state("fp32 momentum + 1 v per row", (FP32, FP32_BYTES * (p.numel + rows)))


def _anyprecision_rule(p: Param, **_: Any) -> ParamState:
    # Trainer's defaults: fp32 momentum and variance, no Kahan buffer (from torchdistx's source; not measured).
    return adamw_rule(p)


def _make_anyprecision(params: Any, lr: float, **kwargs: Any) -> Any:
    from torchdistx.optimizers import AnyPrecisionAdamW

    return AnyPrecisionAdamW(params, lr=lr, **kwargs)


def _make_adam_mini(pairs: list[tuple[Param, Any]], lr: float, **kwargs: Any) -> Any:
    from adam_mini import Adam_mini

    return Adam_mini([(facts.name, t) for facts, t in pairs], lr=lr, **kwargs)


LOMO_IN_BACKWARD = "fused_backward: SGD applied in each parameter's gradient hook"
ADAM_MINI_BERT = ("adam-mini 1.1.1 cannot step a BERT: its name-substring partition sends 1-D LayerNorm weights "
                  "('embeddings.LayerNorm', 'output.LayerNorm') to its row-wise blocks (IndexError: too many indices "
                  "for tensor of dimension 1), and a Llama needs dim/n_heads a registry factory does not see")

EXTRA_ENTRIES = [
    _schedulefree_entry("adamw_schedulefree", "AdamWScheduleFree", _schedulefree_rule(2, "z + exp_avg_sq"),
                        hf_alias="schedule_free_adamw", default_kwargs={**HF_ADAM, **_SCHEDULEFREE, "warmup_steps": 0},
                        description="schedulefree AdamWScheduleFree (= HF optim=schedule_free_adamw): no lr "
                                    "schedule; evaluate between optimizer.eval()/train()"),
    _schedulefree_entry("schedule_free_radam", "RAdamScheduleFree", _schedulefree_rule(2, "z + exp_avg_sq"),
                        hf_alias="schedule_free_radam", default_kwargs={**HF_ADAM, **_SCHEDULEFREE},
                        description="HF optim=schedule_free_radam: schedulefree RAdamScheduleFree (no warm-up)"),
    _schedulefree_entry("schedule_free_sgd", "SGDScheduleFree", _schedulefree_rule(1, "z"),
                        hf_alias="schedule_free_sgd", default_kwargs={**_SCHEDULEFREE, "warmup_steps": 0},
                        default_lr=1e-2, lr_range=(1e-3, 1e-1),
                        description="HF optim=schedule_free_sgd: schedulefree SGDScheduleFree, momentum 0.9"),
    OptimizerSpec(
        name="came", factory=_make_came, library="came_pytorch", extra="came", default_lr=1e-4,
        lr_range=(1e-5, 1e-3), precision="factored+fp32-momentum", rule=_came_rule,
        description="CAME: Adafactor-style factored moments with a confidence-guided residual",
    ),
    OptimizerSpec(
        name="adam_mini", factory=_make_adam_mini, structural=True, library="adam_mini", extra="adam-mini",
        default_lr=5e-5, lr_range=ADAMW_LR_RANGE, precision="fp32-blockwise-v", rule=_adam_mini_rule,
        broken=ADAM_MINI_BERT, description="Adam-mini: one second-moment value per parameter block",
    ),
    OptimizerSpec(
        name="grokadamw", hf_alias="grokadamw", factory=_make_grokadamw, library="grokadamw", extra="grokadamw",
        structural=True,
        default_lr=5e-5, lr_range=ADAMW_LR_RANGE, precision="fp32", rule=_grokadamw_rule,
        default_kwargs={"weight_decay": HF_WEIGHT_DECAY, "alpha_init": 0.98, "lamb": 2.0, "gamma": 0.1,
                        "grokking_signal_decay_rate": 0.1, "gradient_clipping": 1.0},
        description="HF optim=grokadamw: GrokAdamW, AdamW + an EMA of gradients amplified by lamb",
    ),
    OptimizerSpec(
        name="stable_adamw", hf_alias="stable_adamw", factory=_make_stable_adamw, library="optimi", extra="optimi",
        default_lr=5e-5, lr_range=ADAMW_LR_RANGE, precision="fp32", rule=_stable_adamw_rule,
        default_kwargs={**HF_ADAM, "decouple_lr": False, "max_lr": None, "kahan_sum": None},
        description="HF optim=stable_adamw: torch-optimi StableAdamW (update clipping; Kahan sums for bf16)",
    ),
    OptimizerSpec(
        name="lomo", hf_alias="lomo", factory=_lomo_factory("Lomo"), structural=True, library="lomo_optim",
        extra="lomo", default_lr=1e-3, lr_range=(1e-4, 1e-2), precision="none (fused SGD)", rule=_lomo_rule,
        step_in_backward=LOMO_IN_BACKWARD, trainer_optim="lomo",
        description="HF optim=lomo: LOMO, SGD fused into backward (no state); trains under --engine trainer",
    ),
    OptimizerSpec(
        name="adalomo", hf_alias="adalomo", factory=_lomo_factory("AdaLomo"), structural=True, library="lomo_optim",
        extra="lomo", default_lr=1e-3, lr_range=(1e-4, 1e-2), precision="factored", rule=_adalomo_rule,
        step_in_backward=LOMO_IN_BACKWARD, trainer_optim="adalomo",
        needs_cuda="needs CUDA: lomo-optim 0.1.1's AdaLomo puts its second moments on CUDA (.cuda()) when built",
        description="HF optim=adalomo: AdaLomo, factored adaptive LOMO fused into backward",
    ),
    OptimizerSpec(
        name="adamw_anyprecision", hf_alias="adamw_anyprecision", factory=_make_anyprecision, library="torchdistx",
        default_lr=5e-5, lr_range=ADAMW_LR_RANGE, precision="fp32", rule=_anyprecision_rule,
        default_kwargs={**HF_ADAM, "use_kahan_summation": False},
        missing_reason="needs torchdistx, which is not on PyPI (pip finds no distribution; github.com/pytorch/"
                       "torchdistx, archived)",
        description="HF optim=adamw_anyprecision: torchdistx AnyPrecisionAdamW (rule from its source, not measured)",
    ),
]
