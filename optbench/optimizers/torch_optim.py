"""Entries built on torch.optim alone: AdamW (default and fused), SGD, Adafactor, and Muon + AdamW.

torch keeps every state tensor in the parameter's dtype (bf16 parameters get bf16 moments), except
the per-parameter `step`, a 0-d fp32 tensor in AdamW and Adafactor (SGD keeps none).
"""

from __future__ import annotations

from typing import Any

from optbench.optimizers.base import FP32_BYTES, Count, OptimizerSpec, Param, total

ADAMW_LR_RANGE = (1e-5, 3e-4)


def full_moments(p: Param, moments: int, itemsize: int | None = None) -> Count:
    """`moments` state tensors shaped like `p`; fp32 share when they are fp32."""
    size = p.itemsize if itemsize is None else itemsize
    return Count(moments * size * p.numel, p.numel if size == FP32_BYTES else 0)


def adamw_count(params: list[Param], **_: Any) -> Count:
    # exp_avg + exp_avg_sq in the parameter's dtype, plus a 0-d fp32 `step` per parameter.
    return total(full_moments(p, 2) + Count(FP32_BYTES) for p in params)


def _sgd_count(params: list[Param], momentum: float = 0.0, **_: Any) -> Count:
    # One momentum buffer per parameter (a clone of its gradient), none without momentum.
    return total(full_moments(p, 1) for p in params) if momentum else Count()


def _adafactor_torch_count(params: list[Param], **_: Any) -> Count:
    # torch.optim.Adafactor: row and column variances (shapes [..., rows, 1] and [..., 1, cols]) for
    # tensors of rank >= 2, a full variance for vectors, all in the parameter's dtype; fp32 `step`.
    counts = []
    for p in params:
        if len(p.shape) >= 2:
            rows, cols = p.numel // p.shape[-1], p.numel // p.shape[-2]
            counts.append(Count(p.itemsize * (rows + cols) + FP32_BYTES))
        else:
            counts.append(full_moments(p, 1) + Count(FP32_BYTES))
    return total(counts)


def _muon_count(params: list[Param], **_: Any) -> Count:
    # Muon: one momentum buffer per hidden matrix; everything else on AdamW.
    return total(Count(p.nbytes) if p.hidden_matrix else adamw_count([p]) for p in params)


def _make_adamw(params: Any, lr: float, **kwargs: Any) -> Any:
    import torch

    return torch.optim.AdamW(params, lr=lr, **kwargs)


def _make_sgd(params: Any, lr: float, **kwargs: Any) -> Any:
    import torch

    return torch.optim.SGD(params, lr=lr, **kwargs)


def _make_adafactor_torch(params: Any, lr: float, **kwargs: Any) -> Any:
    import torch

    return torch.optim.Adafactor(params, lr=lr, **kwargs)


def _make_muon(pairs: list[tuple[Param, Any]], lr: float, weight_decay: float = 0.01, **kwargs: Any) -> Any:
    import torch

    from optbench.optimizers.combined import CombinedOptimizer

    hidden = [t for facts, t in pairs if facts.hidden_matrix]
    rest = [t for facts, t in pairs if not facts.hidden_matrix]
    parts = []
    if hidden:
        # "match_rms_adamw" scales Muon's orthogonalised update to AdamW's RMS, so one lr serves both parts.
        muon_kwargs = {"adjust_lr_fn": "match_rms_adamw", **kwargs}
        parts.append(torch.optim.Muon(hidden, lr=lr, weight_decay=weight_decay, **muon_kwargs))
    if rest:
        parts.append(torch.optim.AdamW(rest, lr=lr, weight_decay=weight_decay))
    return CombinedOptimizer(parts)


TORCH_ENTRIES = [
    OptimizerSpec(
        name="adamw", hf_alias="adamw_torch", factory=_make_adamw, library="torch",
        default_lr=5e-5, lr_range=ADAMW_LR_RANGE, precision="fp32", count=adamw_count,
        description="torch.optim.AdamW (default implementation): two moments per parameter, the reference",
    ),
    OptimizerSpec(
        name="adamw_fused", hf_alias="adamw_torch_fused", factory=_make_adamw, library="torch",
        default_lr=5e-5, lr_range=ADAMW_LR_RANGE, precision="fp32", count=adamw_count,
        default_kwargs={"fused": True},
        description="torch.optim.AdamW(fused=True): same state, one kernel per step",
    ),
    OptimizerSpec(
        name="sgd", hf_alias="sgd", factory=_make_sgd, library="torch",
        # SGD has no per-coordinate scaling, so it needs a learning rate ~100x AdamW's.
        default_lr=1e-2, lr_range=(1e-3, 1e-1), precision="fp32", count=_sgd_count,
        default_kwargs={"momentum": 0.9},
        description="torch.optim.SGD, momentum 0.9: one buffer per parameter",
    ),
    OptimizerSpec(
        name="adafactor_torch", factory=_make_adafactor_torch, library="torch",
        # torch's Adafactor scales each update by the parameter's RMS (relative steps).
        default_lr=1e-3, lr_range=(1e-4, 1e-2), precision="factored", count=_adafactor_torch_count,
        description="torch.optim.Adafactor: row+column second moment, no momentum",
    ),
    OptimizerSpec(
        name="muon", factory=_make_muon, library="torch", structural=True,
        default_lr=5e-5, lr_range=(1e-5, 1e-3), precision="fp32-orthogonalised", count=_muon_count,
        description="torch.optim.Muon on hidden 2-D matrices (one momentum buffer) + AdamW on embeddings, "
                    "head and vectors",
    ),
]
