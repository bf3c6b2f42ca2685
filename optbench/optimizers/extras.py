"""Entries whose library comes with an optbench extra: torchao's low-bit AdamW, schedule-free AdamW,
GaLore, APOLLO, CAME and Adam-mini (`pip install "optbench[<extra>]"`, or `optbench[all]`)."""

from __future__ import annotations

from typing import Any

from optbench.optimizers.base import (
    FP32,
    FP32_BYTES,
    STEP,
    OptimizerSpec,
    Param,
    ParamState,
    factored_numel,
    full_moments,
    param_state,
    short_dtype,
)
from optbench.optimizers.bnb import bnb_rule, bnb_shared
from optbench.optimizers.torch_optim import ADAMW_LR_RANGE

# ---- torchao: tensor-subclass state, compiled on the first step ----

TORCHAO_MIN_QUANT_NUMEL = 4096


def _torchao_rule(code_bits: int, code_dtype: str, block_size: int, qmap_entries: int, label: str):
    """torchao quantises tensors of >= 4096 elements that its block divides: per moment, `code_bits`
    per element (`code_dtype` codes) + one fp32 scale per block + its own fp32 quantisation map
    (`qmap_entries` values, none for fp8; not shared between tensors, unlike bitsandbytes'). Other
    tensors keep moments in the parameter's dtype. A 0-d fp32 `step` per parameter."""

    def rule(p: Param, **_: Any) -> ParamState:
        if p.numel < TORCHAO_MIN_QUANT_NUMEL:
            return full_moments(p, 2, f"{short_dtype(p.dtype_name)}: under {TORCHAO_MIN_QUANT_NUMEL} elements", STEP)
        if p.numel % block_size:
            return full_moments(p, 2, f"{short_dtype(p.dtype_name)}: block size does not divide", STEP)
        codes = (code_dtype, 2 * (p.numel * code_bits // 8))
        return param_state(label, codes, (FP32, 2 * FP32_BYTES * (p.numel // block_size + qmap_entries)), STEP)

    return rule


def _torchao_entry(class_name: str, name: str, hf_alias: str, precision: str, rule: Any) -> OptimizerSpec:
    def make(params: Any, lr: float, **kwargs: Any) -> Any:
        from torchao import optim as ao_optim

        return getattr(ao_optim, class_name)(params, lr=lr, **kwargs)

    return OptimizerSpec(
        name=name, hf_alias=hf_alias, factory=make, library="torchao", extra="torchao", default_lr=5e-5,
        lr_range=ADAMW_LR_RANGE, precision=precision, rule=rule,
        description=f"torchao {class_name}: tensor-subclass state, compiled on its first step",
    )


# ---- schedule-free AdamW: needs train()/eval() switching around evaluation ----


def _make_schedulefree(params: Any, lr: float, **kwargs: Any) -> Any:
    import schedulefree

    optimizer = schedulefree.AdamWScheduleFree(params, lr=lr, **kwargs)
    optimizer.train()  # it refuses to step in eval mode, and starts in it
    return optimizer


def _schedulefree_rule(p: Param, **_: Any) -> ParamState:
    # z (the averaged iterate's base sequence) and exp_avg_sq, both in the parameter's dtype.
    return full_moments(p, 2, "full: z + exp_avg_sq")


# ---- GaLore and APOLLO: low-rank projected AdamW on chosen 2-D weights ----

LOW_RANK_DEFAULTS = {"rank": 8, "update_proj_gap": 200, "proj_type": "std"}


def _is_target(p: Param, target_modules: list[str] | None) -> bool:
    """Projected parameters: the hidden 2-D matrices, or those whose name holds one of `target_modules`."""
    if len(p.shape) != 2:
        return False
    return p.hidden_matrix if not target_modules else any(t in p.name for t in target_modules)


FULL = "full"


def _adam_moments(p: Param, **_: Any) -> ParamState:
    return full_moments(p, 2, FULL)


def galore_projection_numel(p: Param, rank: int) -> int:
    """GaLore slices its rank-r basis out of a full SVD (U[:, :r] or Vh[:r, :], k = min(m, n)); for
    fp32 parameters it keeps that view, which holds the whole k x k factor alive, and for other dtypes
    it casts, which copies just the r x k slice."""
    k = min(p.shape)
    return k * k if p.itemsize == FP32_BYTES else min(rank, k) * k


def apollo_projection_numel(p: Param, rank: int) -> int:
    """APOLLO draws a fresh r x k random matrix (k = min(m, n)), plus a 0-d `scaled_grad`."""
    return min(rank, *p.shape) * min(p.shape) + 1


def _low_rank_rule(moments: Any, projection_numel: Any):
    """For an (m, n) target at rank r: the optimizer's moments (`moments`, a rule) on the (max(m, n), r)
    projected gradient, plus the projection state (`projection_numel`) in the parameter's dtype; projected
    parameters never count as fp32 state. Other parameters: the plain optimizer (its `step` is an int)."""

    def rule(p: Param, rank: int = 8, target_modules: list[str] | None = None, **settings: Any) -> ParamState:
        if not _is_target(p, target_modules):
            plain = moments(p, **settings)
            why = f"not projected ({'not targeted' if target_modules else p.role})"
            why += f": {plain.why}" if plain.why != FULL else ""
            return ParamState(plain.bytes_by_dtype, why, plain.fp32_state_numel)
        projected = Param(shape=(max(p.shape), min(rank, *p.shape)), itemsize=p.itemsize, dtype=p.dtype_name)
        projection = (p.dtype_name, p.itemsize * projection_numel(p, rank))
        return param_state(f"low-rank r={rank} (projected)", *moments(projected, **settings).bytes_by_dtype.items(),
                           projection)

    return rule


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
        rule=_low_rank_rule(moments, projection_numel), default_kwargs=dict(LOW_RANK_DEFAULTS), **fields,
    )


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
    # Adam-mini's design (paper, not measured: the entry cannot run here): a full fp32 first moment and
    # one fp32 second-moment value per output row of a matrix, one per vector.
    rows = p.shape[0] if len(p.shape) >= 2 else 1
    return param_state("fp32 momentum + 1 v per row", (FP32, FP32_BYTES * (p.numel + rows)))


def _make_adam_mini(pairs: list[tuple[Param, Any]], lr: float, **kwargs: Any) -> Any:
    from adam_mini import Adam_mini

    return Adam_mini([(facts.name, t) for facts, t in pairs], lr=lr, **kwargs)


EXTRA_ENTRIES = [
    _torchao_entry("AdamW8bit", "adamw8bit_torchao", "adamw_torch_8bit", "int8-blockwise",
                   _torchao_rule(8, "uint8", block_size=256, qmap_entries=256, label="8-bit")),
    _torchao_entry("AdamW4bit", "adamw4bit_torchao", "adamw_torch_4bit", "int4-blockwise",
                   _torchao_rule(4, "uint8", block_size=128, qmap_entries=16, label="4-bit")),
    _torchao_entry("AdamWFp8", "adamw_fp8_torchao", "", "fp8-e4m3-blockwise",
                   _torchao_rule(8, "float8_e4m3fn", block_size=256, qmap_entries=0, label="fp8")),
    OptimizerSpec(
        name="adamw_schedulefree", hf_alias="schedule_free_adamw", factory=_make_schedulefree,
        library="schedulefree", extra="schedulefree",
        # No decay schedule to lean on: the authors advise 1-10x AdamW's lr (and a warm-up).
        default_lr=1e-4, lr_range=(1e-5, 1e-3), precision="fp32", rule=_schedulefree_rule,
        before_eval=lambda optimizer: optimizer.eval(), after_eval=lambda optimizer: optimizer.train(),
        description="schedulefree AdamWScheduleFree: no lr schedule; evaluate between optimizer.eval()/train()",
    ),
    _low_rank_entry("galore_adamw", "galore_torch", "GaLoreAdamW", "galore", {"scale": 0.25}, _adam_moments,
                    galore_projection_numel, hf_alias="galore_adamw", precision="fp32-low-rank",
                    description="GaLore AdamW: moments of the rank-8 projected gradient of hidden matrices"),
    _low_rank_entry("galore_adamw8bit", "galore_torch", "GaLoreAdamW8bit", "galore", {"scale": 0.25},
                    bnb_rule(2, bits8=True), galore_projection_numel, hf_alias="galore_adamw_8bit",
                    shared=bnb_shared(2),
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
        lr_range=(1e-5, 1e-3), precision="factored+fp32-momentum", rule=_came_rule,
        description="CAME: Adafactor-style factored moments with a confidence-guided residual",
    ),
    OptimizerSpec(
        name="adam_mini", factory=_make_adam_mini, structural=True, library="adam_mini", extra="adam-mini",
        default_lr=5e-5, lr_range=ADAMW_LR_RANGE, precision="fp32-blockwise-v", rule=_adam_mini_rule,
        broken="adam-mini 1.1.1 crashes on BERT's first step (IndexError: too many indices for tensor of "
               "dimension 1); its name-based block partition does not cover BERT",
        description="Adam-mini: one second-moment value per parameter block",
    ),
]
