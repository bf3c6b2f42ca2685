"""Entries whose library comes with an optbench extra: torchao's low-bit AdamW, schedule-free AdamW,
GaLore, APOLLO, CAME and Adam-mini (`pip install "optbench[<extra>]"`, or `optbench[all]`)."""

from __future__ import annotations

from typing import Any

from optbench.optimizers.base import FP32_BYTES, Count, OptimizerSpec, Param, total
from optbench.optimizers.bnb import bnb_count
from optbench.optimizers.torch_optim import ADAMW_LR_RANGE, full_moments

# ---- torchao: tensor-subclass state, compiled on the first step ----


def _torchao_count(code_bits: int, block_size: int, qmap_entries: int):
    """torchao quantises tensors of >= 4096 elements that its block divides: per moment, `code_bits`
    per element + one fp32 scale per block + its own fp32 quantisation map (`qmap_entries` values, none
    for fp8; not shared between tensors, unlike bitsandbytes'). Other tensors keep moments in the
    parameter's dtype. A 0-d fp32 `step` per parameter."""

    def count(params: list[Param], **_: Any) -> Count:
        counts = []
        for p in params:
            if p.numel >= 4096 and p.numel % block_size == 0:
                per_moment = p.numel * code_bits // 8 + FP32_BYTES * (p.numel // block_size + qmap_entries)
                counts.append(Count(2 * per_moment))
            else:
                counts.append(full_moments(p, 2))
            counts.append(Count(FP32_BYTES))
        return total(counts)

    return count


def _torchao_entry(class_name: str, name: str, hf_alias: str, precision: str, count: Any) -> OptimizerSpec:
    def make(params: Any, lr: float, **kwargs: Any) -> Any:
        from torchao import optim as ao_optim

        return getattr(ao_optim, class_name)(params, lr=lr, **kwargs)

    return OptimizerSpec(
        name=name, hf_alias=hf_alias, factory=make, library="torchao", extra="torchao", default_lr=5e-5,
        lr_range=ADAMW_LR_RANGE, precision=precision, count=count,
        description=f"torchao {class_name}: tensor-subclass state, compiled on its first step",
    )


# ---- schedule-free AdamW: needs train()/eval() switching around evaluation ----


def _make_schedulefree(params: Any, lr: float, **kwargs: Any) -> Any:
    import schedulefree

    optimizer = schedulefree.AdamWScheduleFree(params, lr=lr, **kwargs)
    optimizer.train()  # it refuses to step in eval mode, and starts in it
    return optimizer


def _schedulefree_count(params: list[Param], **_: Any) -> Count:
    # z (the averaged iterate's base sequence) and exp_avg_sq, both in the parameter's dtype.
    return total(full_moments(p, 2) for p in params)


# ---- GaLore and APOLLO: low-rank projected AdamW on chosen 2-D weights ----

LOW_RANK_DEFAULTS = {"rank": 8, "update_proj_gap": 200, "proj_type": "std"}


def _is_target(p: Param, target_modules: list[str] | None) -> bool:
    """Projected parameters: the hidden 2-D matrices, or those whose name holds one of `target_modules`."""
    if len(p.shape) != 2:
        return False
    return p.hidden_matrix if not target_modules else any(t in p.name for t in target_modules)


def _adam_moments(params: list[Param], **_: Any) -> Count:
    return total(full_moments(p, 2) for p in params)


def galore_projection_numel(p: Param, rank: int) -> int:
    """GaLore slices its rank-r basis out of a full SVD (U[:, :r] or Vh[:r, :], k = min(m, n)); for
    fp32 parameters it keeps that view, which holds the whole k x k factor alive, and for other dtypes
    it casts, which copies just the r x k slice."""
    k = min(p.shape)
    return k * k if p.itemsize == FP32_BYTES else min(rank, k) * k


def apollo_projection_numel(p: Param, rank: int) -> int:
    """APOLLO draws a fresh r x k random matrix (k = min(m, n)), plus a 0-d `scaled_grad`."""
    return min(rank, *p.shape) * min(p.shape) + 1


def _low_rank_count(moments: Any, projection_numel: Any):
    """For an (m, n) target at rank r: the optimizer's moments (`moments`, a count over parameters) on
    the (max(m, n), r) projected gradient, plus the projection state (`projection_numel`) in the
    parameter's dtype; projected parameters never count as fp32 state. Other parameters: the plain
    optimizer (its `step` is an int)."""

    def count(params: list[Param], rank: int = 8, target_modules: list[str] | None = None, **settings: Any) -> Count:
        targets = [p for p in params if _is_target(p, target_modules)]
        rest = [p for p in params if not _is_target(p, target_modules)]
        projected = [Param(shape=(max(p.shape), min(rank, *p.shape)), itemsize=p.itemsize) for p in targets]
        projection_bytes = sum(p.itemsize * projection_numel(p, rank) for p in targets)
        return (Count(moments(projected + rest, **settings).state_bytes + projection_bytes)
                + Count(0, moments(rest, **settings).fp32_state_numel))

    return count


def _exposing_projections(cls: type) -> type:
    """GaLore and APOLLO keep each projection matrix on a projector object the state probe cannot see;
    this subclass puts a reference to it in state['projection'] after every step (same storage, no
    copy), so it is measured like any other state. A subclass, not a patched `step`: lr schedulers
    wrap `optimizer.step` and expect a bound method."""

    class ExposingProjections(cls):
        def step(self, *args: Any, **kwargs: Any) -> Any:
            loss = super().step(*args, **kwargs)
            for state in self.state.values():
                projector = state.get("projector")
                if projector is not None and projector.ortho_matrix is not None:
                    state["projection"] = projector.ortho_matrix
            return loss

    ExposingProjections.__name__ = ExposingProjections.__qualname__ = cls.__name__
    return ExposingProjections


def _low_rank_factory(module: str, class_name: str, group_defaults: dict[str, Any]):
    def make(pairs: list[tuple[Param, Any]], lr: float, rank: int = 8, update_proj_gap: int = 200,
             proj_type: str = "std", target_modules: list[str] | None = None, **kwargs: Any) -> Any:
        import importlib

        cls = _exposing_projections(getattr(importlib.import_module(module), class_name))
        targets = [t for facts, t in pairs if _is_target(facts, target_modules)]
        rest = [t for facts, t in pairs if not _is_target(facts, target_modules)]
        low_rank = {"params": targets, "rank": rank, "update_proj_gap": update_proj_gap, "proj_type": proj_type,
                    **group_defaults}
        groups = [g for g in ({"params": rest}, low_rank) if g["params"]]
        return cls(groups, lr=lr, **kwargs)

    return make


def _low_rank_entry(name: str, module: str, class_name: str, extra: str, group_defaults: dict[str, Any],
                    moments: Any, projection_numel: Any, **fields: Any) -> OptimizerSpec:
    return OptimizerSpec(
        name=name, factory=_low_rank_factory(module, class_name, group_defaults), structural=True,
        library=module, extra=extra, default_lr=1e-4, lr_range=(1e-5, 1e-3),
        count=_low_rank_count(moments, projection_numel), default_kwargs=dict(LOW_RANK_DEFAULTS), **fields,
    )


# ---- CAME: confidence-guided factored Adam ----


def _came_count(params: list[Param], **_: Any) -> Count:
    # Computes in fp32: a full fp32 first moment; for rank >= 2 factored second moment and factored
    # residual (row + column each); for vectors a full fp32 second moment; a 0-d RMS in the param dtype.
    counts = []
    for p in params:
        if len(p.shape) >= 2:
            rows, cols = p.numel // p.shape[-1], p.numel // p.shape[-2]
            counts.append(Count(FP32_BYTES * (p.numel + 2 * (rows + cols)) + p.itemsize))
        else:
            counts.append(Count(2 * FP32_BYTES * p.numel + p.itemsize, p.numel))
    return total(counts)


def _make_came(params: Any, lr: float, **kwargs: Any) -> Any:
    from came_pytorch import CAME

    return CAME(params, lr=lr, **kwargs)


def _adam_mini_count(params: list[Param], **_: Any) -> Count:
    # Adam-mini's design (paper, not measured: the entry cannot run here): a full fp32 first moment and
    # one fp32 second-moment value per output row of a matrix, one per vector.
    return total(Count(FP32_BYTES * (p.numel + (p.shape[0] if len(p.shape) >= 2 else 1))) for p in params)


def _make_adam_mini(pairs: list[tuple[Param, Any]], lr: float, **kwargs: Any) -> Any:
    from adam_mini import Adam_mini

    return Adam_mini([(facts.name, t) for facts, t in pairs], lr=lr, **kwargs)


EXTRA_ENTRIES = [
    _torchao_entry("AdamW8bit", "adamw8bit_torchao", "adamw_torch_8bit", "int8-blockwise",
                   _torchao_count(code_bits=8, block_size=256, qmap_entries=256)),
    _torchao_entry("AdamW4bit", "adamw4bit_torchao", "adamw_torch_4bit", "int4-blockwise",
                   _torchao_count(code_bits=4, block_size=128, qmap_entries=16)),
    _torchao_entry("AdamWFp8", "adamw_fp8_torchao", "", "fp8-e4m3-blockwise",
                   _torchao_count(code_bits=8, block_size=256, qmap_entries=0)),
    OptimizerSpec(
        name="adamw_schedulefree", hf_alias="schedule_free_adamw", factory=_make_schedulefree,
        library="schedulefree", extra="schedulefree",
        # No decay schedule to lean on: the authors advise 1-10x AdamW's lr (and a warm-up).
        default_lr=1e-4, lr_range=(1e-5, 1e-3), precision="fp32", count=_schedulefree_count,
        before_eval=lambda optimizer: optimizer.eval(), after_eval=lambda optimizer: optimizer.train(),
        description="schedulefree AdamWScheduleFree: no lr schedule; evaluate between optimizer.eval()/train()",
    ),
    _low_rank_entry("galore_adamw", "galore_torch", "GaLoreAdamW", "galore", {"scale": 0.25}, _adam_moments,
                    galore_projection_numel, hf_alias="galore_adamw", precision="fp32-low-rank",
                    description="GaLore AdamW: moments of the rank-8 projected gradient of hidden matrices"),
    _low_rank_entry("galore_adamw8bit", "galore_torch", "GaLoreAdamW8bit", "galore", {"scale": 0.25},
                    bnb_count(2, bits8=True), galore_projection_numel, hf_alias="galore_adamw_8bit",
                    precision="int8-low-rank",
                    needs_cuda="needs CUDA: galore-torch 1.0's GaLoreAdamW8bit runs bitsandbytes' CUDA-only "
                               "8-bit update ('Torch not compiled with CUDA enabled' on a CPU build)",
                    description="GaLore AdamW8bit: 8-bit moments of the projected gradient"),
    _low_rank_entry("apollo_adamw", "apollo_torch", "APOLLOAdamW", "apollo",
                    {"proj": "random", "scale_type": "channel", "scale": 1.0}, _adam_moments,
                    apollo_projection_numel,
                    hf_alias="apollo_adamw", precision="fp32-low-rank",
                    description="APOLLO AdamW: random-projection moments, channel-wise update scaling"),
    OptimizerSpec(
        name="came", factory=_make_came, library="came_pytorch", extra="came", default_lr=1e-4,
        lr_range=(1e-5, 1e-3), precision="factored+fp32-momentum", count=_came_count,
        description="CAME: Adafactor-style factored moments with a confidence-guided residual",
    ),
    OptimizerSpec(
        name="adam_mini", factory=_make_adam_mini, structural=True, library="adam_mini", extra="adam-mini",
        default_lr=5e-5, lr_range=ADAMW_LR_RANGE, precision="fp32-blockwise-v", count=_adam_mini_count,
        broken="adam-mini 1.1.1 crashes on BERT's first step (IndexError: too many indices for tensor of "
               "dimension 1); its name-based block partition does not cover BERT",
        description="Adam-mini: one second-moment value per parameter block",
    ),
]
