"""Entries built on torch.optim alone: AdamW (default and fused), SGD, Adagrad, RMSprop, Adafactor, Muon + AdamW,
HF Trainer's names for them (`adamw_torch`, `sgd`, ...: Trainer's settings, optimizers/hf.py), and the AdamW
variants for devices this machine lacks (XLA, Ascend NPU).

torch keeps every state tensor in the parameter's dtype (bf16 parameters get bf16 moments), except
the per-parameter `step`, a 0-d fp32 tensor in AdamW, Adagrad, RMSprop and Adafactor (SGD keeps none).
"""

from __future__ import annotations

import functools
from typing import Any

from optbench.optimizers.base import (
    FP32,
    STEP,
    OptimizerSpec,
    Param,
    ParamState,
    factored_numel,
    full_moments,
    param_state,
)
from optbench.optimizers.hf import HF_ADAM, HF_WEIGHT_DECAY

ADAMW_LR_RANGE = (1e-5, 3e-4)


def adamw_rule(p: Param, **_: Any) -> ParamState:
    # exp_avg + exp_avg_sq in the parameter's dtype, plus a 0-d fp32 `step` per parameter.
    return full_moments(p, 2, "full: 2 moments", STEP)


def _sgd_rule(p: Param, momentum: float = 0.0, **_: Any) -> ParamState:
    # One momentum buffer per parameter (a clone of its gradient), none without momentum.
    return full_moments(p, 1, "full: momentum") if momentum else param_state("none: no momentum")


def one_moment_rule(what: str):
    """Adagrad's `sum`, RMSprop's `square_avg` (no momentum, not centred): one tensor in the parameter's dtype and
    a 0-d fp32 `step`."""

    def rule(p: Param, **_: Any) -> ParamState:
        return full_moments(p, 1, f"full: {what}", STEP)

    return rule


def factored_or_full(p: Param, dtype: str, itemsize: int) -> tuple[tuple[str, int], str]:
    """A second moment kept as row + column statistics for tensors of rank >= 2, in full for vectors:
    the (dtype, bytes) part and why."""
    if len(p.shape) >= 2:
        return (dtype, itemsize * factored_numel([p.shape])), "factored (rows + cols)"
    return (dtype, itemsize * p.numel), "full (vector)"


def _adafactor_torch_rule(p: Param, **_: Any) -> ParamState:
    # torch.optim.Adafactor: row and column variances (shapes [..., rows, 1] and [..., 1, cols]) for
    # tensors of rank >= 2, a full variance for vectors, all in the parameter's dtype; fp32 `step`.
    second, why = factored_or_full(p, p.dtype_name, p.itemsize)
    full_fp32 = len(p.shape) < 2 and p.dtype_name == FP32
    return param_state(why, second, STEP, fp32_state_numel=p.numel if full_fp32 else 0)


def _muon_rule(p: Param, **_: Any) -> ParamState:
    # Muon: one momentum buffer per hidden matrix; everything else on AdamW.
    if p.hidden_matrix:
        return param_state("Muon momentum", (p.dtype_name, p.nbytes))
    return full_moments(p, 2, f"AdamW fallback ({p.role})", STEP)


def _torch_factory(class_name: str):
    def make(params: Any, lr: float, **kwargs: Any) -> Any:
        import torch

        return getattr(torch.optim, class_name)(params, lr=lr, **kwargs)

    return make


def _elsewhere_factory(module: str, class_name: str):
    """A class from a device library this machine may lack (torch_xla, torch_npu)."""

    def make(params: Any, lr: float, **kwargs: Any) -> Any:
        import importlib

        return getattr(importlib.import_module(module), class_name)(params, lr=lr, **kwargs)

    return make


def _newton_schulz(grad: Any, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float,
                   dtype: Any) -> Any:
    """torch.optim.Muon's quintic Newton–Schulz orthogonalisation (same steps and coefficients), in `dtype`."""
    import torch

    a, b, c = ns_coefficients
    x = grad.to(dtype)
    tall = grad.size(0) > grad.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


@functools.cache
def _fp32_muon_class() -> type:
    """torch.optim.Muon with its Newton–Schulz products in fp32 instead of bf16.

    torch casts to bf16, the right call on a GPU; on a CPU without bf16 matrix units a bf16 product is
    12x slower than fp32 (0.41 s against 0.034 s for MiniLM's 384x1536 shape on this 2-core EPYC), which
    turns one Muon step on MiniLM into about a minute. The update is the same iteration, computed more
    precisely. torch calls the module-level function by name, so the step swaps it for the duration.
    Built once, on first use, so that importing the registry does not import torch.
    """
    import torch
    from torch.optim import _muon

    class Fp32NewtonSchulzMuon(torch.optim.Muon):
        def step(self, closure: Any = None) -> Any:
            original = _muon._zeropower_via_newtonschulz
            _muon._zeropower_via_newtonschulz = functools.partial(_newton_schulz, dtype=torch.float32)
            try:
                return super().step(closure)
            finally:
                _muon._zeropower_via_newtonschulz = original

    return Fp32NewtonSchulzMuon


def _make_muon(pairs: list[tuple[Param, Any]], lr: float, weight_decay: float = 0.01, ns_dtype: str = "auto",
               **kwargs: Any) -> Any:
    """`ns_dtype`: "bfloat16" (torch's), "float32", or "auto": bf16 on CUDA, fp32 elsewhere (see above)."""
    import torch

    from optbench.optimizers.combined import CombinedOptimizer

    if ns_dtype not in ("auto", "bfloat16", "float32"):
        raise ValueError(f"muon: ns_dtype must be auto, bfloat16 or float32, not {ns_dtype!r}")
    hidden = [t for facts, t in pairs if facts.hidden_matrix]
    rest = [t for facts, t in pairs if not facts.hidden_matrix]
    parts = []
    if hidden:
        on_cuda = hidden[0].device.type == "cuda"
        muon = torch.optim.Muon if ns_dtype == "bfloat16" or (ns_dtype == "auto" and on_cuda) else _fp32_muon_class()
        # "match_rms_adamw" scales Muon's orthogonalised update to AdamW's RMS, so one lr serves both parts.
        muon_kwargs = {"adjust_lr_fn": "match_rms_adamw", **kwargs}
        parts.append(muon(hidden, lr=lr, weight_decay=weight_decay, **muon_kwargs))
    if rest:
        parts.append(torch.optim.AdamW(rest, lr=lr, weight_decay=weight_decay))
    return CombinedOptimizer(parts)


def _hf_entry(name: str, class_name: str, rule: Any, default_lr: float, lr_range: tuple[float, float],
              description: str, **kwargs: Any) -> OptimizerSpec:
    """HF Trainer's `optim=name`: torch.optim.<class_name> with Trainer's settings."""
    return OptimizerSpec(name=name, hf_alias=name, factory=_torch_factory(class_name), library="torch",
                         default_lr=default_lr, lr_range=lr_range, precision="fp32", rule=rule,
                         default_kwargs={"weight_decay": HF_WEIGHT_DECAY, **kwargs}, description=description,
                         fsdp2="local" if class_name == "AdamW" and not kwargs.get("fused") else "")


# RMSprop's per-coordinate scaling without momentum wants about AdamW's lr; Adagrad's accumulated sum shrinks its
# steps over time, so it starts higher.
RMSPROP_LR = dict(default_lr=2e-5, lr_range=(3e-6, 3e-4))
HF_TORCH_ENTRIES = [
    _hf_entry("adamw_torch", "AdamW", adamw_rule, 5e-5, ADAMW_LR_RANGE, "HF optim=adamw_torch: torch AdamW with "
              "Trainer's weight decay 0", **HF_ADAM),
    _hf_entry("adamw_torch_fused", "AdamW", adamw_rule, 5e-5, ADAMW_LR_RANGE, "HF optim=adamw_torch_fused: "
              "torch AdamW(fused=True), weight decay 0", **HF_ADAM, fused=True),
    _hf_entry("sgd", "SGD", _sgd_rule, 1e-2, (1e-3, 1e-1), "HF optim=sgd: torch SGD without momentum (no state)"),
    _hf_entry("adagrad", "Adagrad", one_moment_rule("sum"), 1e-2, (1e-3, 1e-1),
              "HF optim=adagrad: torch Adagrad, one accumulated sum of squares"),
    _hf_entry("rmsprop", "RMSprop", one_moment_rule("square_avg"), RMSPROP_LR["default_lr"], RMSPROP_LR["lr_range"],
              "HF optim=rmsprop: torch RMSprop, one running square average"),
    OptimizerSpec(
        name="adamw_torch_xla", hf_alias="adamw_torch_xla", factory=_elsewhere_factory("torch_xla.amp.syncfree",
                                                                                          "AdamW"),
        library="torch_xla", default_lr=5e-5, lr_range=ADAMW_LR_RANGE, precision="fp32", rule=adamw_rule,
        default_kwargs=dict(HF_ADAM), missing_reason="XLA devices (TPU) only: needs torch_xla",
        description="HF optim=adamw_torch_xla: torch_xla's sync-free AdamW (rule: torch AdamW's, not measured here)",
    ),
    OptimizerSpec(
        name="adamw_torch_npu_fused", hf_alias="adamw_torch_npu_fused",
        factory=_elsewhere_factory("torch_npu.optim", "NpuFusedAdamW"), library="torch_npu", default_lr=5e-5,
        lr_range=ADAMW_LR_RANGE, precision="fp32", rule=adamw_rule, default_kwargs=dict(HF_ADAM),
        missing_reason="Ascend NPU only: needs torch_npu",
        description="HF optim=adamw_torch_npu_fused: torch_npu's fused AdamW (rule: torch AdamW's, not measured)",
    ),
]

TORCH_ENTRIES = [
    OptimizerSpec(
        name="adamw", factory=_torch_factory("AdamW"), library="torch",
        default_lr=5e-5, lr_range=ADAMW_LR_RANGE, precision="fp32", rule=adamw_rule,
        description="torch.optim.AdamW (default implementation): two moments per parameter, the reference",
        fsdp2="local",
    ),
    OptimizerSpec(
        name="adamw_fused", factory=_torch_factory("AdamW"), library="torch",
        default_lr=5e-5, lr_range=ADAMW_LR_RANGE, precision="fp32", rule=adamw_rule,
        default_kwargs={"fused": True},
        description="torch.optim.AdamW(fused=True): same state, one kernel per step",
    ),
    OptimizerSpec(
        name="sgd_momentum", factory=_torch_factory("SGD"), library="torch",
        # SGD has no per-coordinate scaling, so it needs a learning rate ~100x AdamW's.
        default_lr=1e-2, lr_range=(1e-3, 1e-1), precision="fp32", rule=_sgd_rule,
        default_kwargs={"momentum": 0.9},
        description="torch.optim.SGD, momentum 0.9: one buffer per parameter",
    ),
    OptimizerSpec(
        name="adafactor_torch", factory=_torch_factory("Adafactor"), library="torch",
        # torch's Adafactor scales each update by the parameter's RMS (relative steps).
        default_lr=1e-3, lr_range=(1e-4, 1e-2), precision="factored", rule=_adafactor_torch_rule,
        description="torch.optim.Adafactor: row+column second moment, no momentum",
    ),
    OptimizerSpec(
        name="muon", factory=_make_muon, library="torch", structural=True,
        default_lr=5e-5, lr_range=(1e-5, 1e-3), precision="fp32-orthogonalised", rule=_muon_rule,
        description="torch.optim.Muon on hidden 2-D matrices (one momentum buffer) + AdamW on embeddings, "
                    "head and vectors; Newton–Schulz in bf16 on CUDA, fp32 on CPU (ns_dtype=)",
    ),
    OptimizerSpec(
        name="muon_torch", factory=_make_muon, library="torch", structural=True,
        default_lr=5e-5, lr_range=(1e-5, 1e-3), precision="fp32-orthogonalised", rule=_muon_rule,
        default_kwargs={"ns_dtype": "bfloat16"},
        description="torch.optim.Muon itself (its bf16 Newton–Schulz on every device) on muon's split: the same "
                    "state, torch's step time",
    ),
    *HF_TORCH_ENTRIES,
]
