"""GaLore and APOLLO: AdamW (or Adafactor) on low-rank projections of chosen 2-D weights
(`pip install "optbench[galore]"` / `"optbench[apollo]"`).

The `_r8` entries project the hidden matrices (2-D weights of the model body) at rank 8. HF Trainer's names
(`galore_adamw`, `apollo_adamw`, ...) project the `nn.Linear` weights `optim_target_modules` selects — HF requires
it; optbench passes "all-linear" — at Trainer's rank 128 (optimizers/hf.py). The layer-wise names build one
optimizer per parameter and step it from a post-accumulate-grad hook, inside backward, as Trainer does: their
optimizer.step() does nothing (`combined.LayerwiseOptimizer`), so they cannot wait for ranks to average gradients.
"""

from __future__ import annotations

import re
from typing import Any

from optbench.optimizers.base import FP32, FP32_BYTES, OptimizerSpec, Param, ParamState, full_moments, param_state
from optbench.optimizers.bnb import bnb_rule, bnb_shared
from optbench.optimizers.hf import HF_ADAM, HF_APOLLO, HF_GALORE, HF_TARGET_MODULES
from optbench.optimizers.transformers_optim import adafactor_rule

LOW_RANK_DEFAULTS = {"rank": 8, "update_proj_gap": 200, "proj_type": "std"}
FULL = "full"
IN_BACKWARD = "one optimizer per parameter, stepped by a post-accumulate-grad hook"
GALORE_8BIT_CUDA = ("needs CUDA: galore-torch 1.0's GaLoreAdamW8bit runs bitsandbytes' CUDA-only 8-bit update "
                    "('Torch not compiled with CUDA enabled' on a CPU build)")


def is_target(p: Param, target_modules: str | list[str] | None) -> bool:
    """Projected parameters. None: the hidden matrices. Otherwise HF's `optim_target_modules` rule: an nn.Linear
    weight whose module's name is "all-linear"-selected, matches a string pattern fully, or (a list) is in the list,
    holds one of its strings or matches one of them fully (transformers.trainer_utils.check_target_module_exists)."""
    if target_modules is None:
        return p.hidden_matrix
    if not p.linear_weight:
        return False
    name = p.name.rpartition(".")[0]  # the module that holds it
    if isinstance(target_modules, str):
        return target_modules.replace("_", "-") == "all-linear" or bool(re.fullmatch(target_modules, name))
    return name in target_modules or any(t in name for t in target_modules) or \
        any(re.fullmatch(t, name) for t in target_modules)


def _adam_moments(p: Param, **_: Any) -> ParamState:
    return full_moments(p, 2, FULL)


def galore_projection_numel(p: Param, rank: int) -> int:
    """GaLore slices its rank-r basis out of a full SVD (U[:, :r] or Vh[:r, :], k = min(m, n)); for
    fp32 parameters it keeps that view, which holds the whole k x k factor alive, and for other dtypes
    it casts, which copies just the r x k slice."""
    k = min(p.shape)
    return k * k if p.itemsize == FP32_BYTES else min(rank, k) * k


def apollo_projection_numel(p: Param, rank: int) -> int:
    """APOLLO draws a fresh r x k random matrix (k = min(m, n); r is not capped at k), plus a 0-d `scaled_grad`."""
    return rank * min(p.shape) + 1


def _low_rank_rule(moments: Any, projection_numel: Any, cap_rank: bool = True, fp32_compute: bool = False):
    """For an (m, n) target at rank r: the optimizer's moments (`moments`, a rule) on the (max(m, n), r) projected
    gradient (r capped at min(m, n) where the library caps it), plus the projection state (`projection_numel`) in the
    dtype the gradient is projected in (the parameter's, or fp32 for an optimizer that computes in fp32); projected
    parameters never count as fp32 state. Other parameters: the plain optimizer (its `step` is an int)."""

    def rule(p: Param, rank: int = 8, target_modules: Any = None, **settings: Any) -> ParamState:
        if not is_target(p, target_modules):
            plain = moments(p, **settings)
            why = f"not projected ({'not targeted' if target_modules else p.role})"
            why += f": {plain.why}" if plain.why != FULL else ""
            return ParamState(plain.bytes_by_dtype, why, plain.fp32_state_numel)
        width = min(rank, *p.shape) if cap_rank else rank
        projected = Param(shape=(max(p.shape), width), itemsize=p.itemsize, dtype=p.dtype_name)
        basis = Param(shape=p.shape, itemsize=FP32_BYTES, dtype=FP32) if fp32_compute else p
        projection = (basis.dtype_name, basis.itemsize * projection_numel(basis, rank))
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


def _low_rank_factory(module: str, class_name: str, group_defaults: dict[str, Any], layerwise: bool = False):
    """Two groups (the rest, the projected targets with rank & co.) as Trainer builds them; `layerwise`: one
    optimizer per parameter with the same groups, stepped from its gradient hook (Trainer's layer-wise names)."""

    def make(pairs: list[tuple[Param, Any]], lr: float, rank: int = 8, update_proj_gap: int = 200,
             proj_type: str = "std", target_modules: Any = None, **kwargs: Any) -> Any:
        import importlib

        cls = _exposing_projections(getattr(importlib.import_module(module), class_name))
        targets = {id(t) for facts, t in pairs if is_target(facts, target_modules)}
        low_rank = {"rank": rank, "update_proj_gap": update_proj_gap, "proj_type": proj_type, **group_defaults}
        if layerwise:
            return _layerwise([cls([{"params": [t], **(low_rank if id(t) in targets else {})}], lr=lr, **kwargs)
                               for _, t in pairs])
        groups = [{"params": [t for _, t in pairs if id(t) not in targets]},
                  {"params": [t for _, t in pairs if id(t) in targets], **low_rank}]
        return cls([g for g in groups if g["params"]], lr=lr, **kwargs)

    return make


def _layerwise(parts: list[Any]) -> Any:
    """Each part steps (and drops its gradient) as soon as its parameter's gradient is complete."""
    from optbench.optimizers.combined import LayerwiseOptimizer

    def hook(part: Any):
        def step_now(_: Any) -> None:
            part.step()
            part.zero_grad()

        return step_now

    for part in parts:
        for group in part.param_groups:
            for param in group["params"]:
                param.register_post_accumulate_grad_hook(hook(part))
    return LayerwiseOptimizer(parts)


def _entry(name: str, module: str, class_name: str, extra: str, group_defaults: dict[str, Any], rule: Any,
           layerwise: bool = False, **fields: Any) -> OptimizerSpec:
    lr = dict(default_lr=1e-4, lr_range=(1e-5, 1e-3))
    if layerwise:
        fields["step_in_backward"] = IN_BACKWARD
    return OptimizerSpec(
        name=name, factory=_low_rank_factory(module, class_name, group_defaults, layerwise), structural=True,
        library=module, extra=extra, rule=rule, **{**lr, "default_kwargs": dict(LOW_RANK_DEFAULTS), **fields},
    )


_GALORE = _low_rank_rule(_adam_moments, galore_projection_numel)
_GALORE_8BIT = _low_rank_rule(bnb_rule(2, bits8=True), galore_projection_numel)
_GALORE_ADAFACTOR = _low_rank_rule(adafactor_rule, galore_projection_numel, fp32_compute=True)
_APOLLO = _low_rank_rule(_adam_moments, apollo_projection_numel, cap_rank=False)
_HF_GALORE = {**{k: v for k, v in HF_GALORE.items() if k != "scale"}, "target_modules": HF_TARGET_MODULES}
_HF_APOLLO = {"rank": HF_APOLLO["rank"], "update_proj_gap": HF_APOLLO["update_proj_gap"],
              "proj_type": HF_APOLLO["proj_type"], "target_modules": HF_TARGET_MODULES}
# APOLLO's target group also gets Trainer's betas and eps; the rest keeps the class's (eps 1e-6).
_APOLLO_GROUP = {"proj": "random", "scale_type": "channel", "scale": 1.0}
_HF_APOLLO_GROUP = {**_APOLLO_GROUP, "betas": HF_ADAM["betas"], "eps": HF_ADAM["eps"]}
_ADAFACTOR_EXTERNAL_LR = {"scale_parameter": False, "relative_step": False}
GALORE_ADAFACTOR_LAYERWISE = (
    "transformers 5.24 cannot build it: for the layer-wise name Trainer leaves GaLoreAdafactor's relative_step on "
    "and also passes an lr ('Cannot combine manual `lr` and `relative_step=True` options')")


def _galore(name: str, class_name: str, rule: Any, hf: bool, layerwise: bool = False,
            default_kwargs: dict[str, Any] | None = None, **fields: Any) -> OptimizerSpec:
    """A GaLore entry: rank 8 on the hidden matrices, or (`hf`) HF's name with Trainer's settings."""
    settings = {**(_HF_GALORE if hf else LOW_RANK_DEFAULTS), **(default_kwargs or {})}
    return _entry(name, "galore_torch", class_name, "galore", {"scale": HF_GALORE["scale"]}, rule, layerwise,
                  hf_alias=name if hf else "", default_kwargs=settings, **fields)


LOW_RANK_ENTRIES = [
    _galore("galore_adamw_r8", "GaLoreAdamW", _GALORE, hf=False, precision="fp32-low-rank",
            description="GaLore AdamW: moments of the rank-8 projected gradient of hidden matrices"),
    _galore("galore_adamw8bit", "GaLoreAdamW8bit", _GALORE_8BIT, hf=False, shared=bnb_shared(2),
            precision="int8-low-rank", needs_cuda=GALORE_8BIT_CUDA,
            description="GaLore AdamW8bit: 8-bit moments of the rank-8 projected gradient"),
    _entry("apollo_adamw_r8", "apollo_torch", "APOLLOAdamW", "apollo", _APOLLO_GROUP, _APOLLO,
           precision="fp32-low-rank",
           description="APOLLO AdamW: random-projection moments (rank 8), channel-wise update scaling"),
    _galore("galore_adamw", "GaLoreAdamW", _GALORE, hf=True, precision="fp32-low-rank",
            description="HF optim=galore_adamw: GaLore AdamW, rank 128 on every nn.Linear weight"),
    _galore("galore_adamw_8bit", "GaLoreAdamW8bit", _GALORE_8BIT, hf=True, shared=bnb_shared(2),
            precision="int8-low-rank", needs_cuda=GALORE_8BIT_CUDA,
            description="HF optim=galore_adamw_8bit: GaLore AdamW8bit, rank 128 on every nn.Linear weight"),
    _galore("galore_adafactor", "GaLoreAdafactor", _GALORE_ADAFACTOR, hf=True, precision="factored-low-rank",
            default_kwargs=_ADAFACTOR_EXTERNAL_LR, default_lr=3e-4, lr_range=(3e-5, 3e-3),
            description="HF optim=galore_adafactor: GaLore Adafactor (external lr), rank 128 on nn.Linear weights"),
    _galore("galore_adamw_layerwise", "GaLoreAdamW", _GALORE, hf=True, layerwise=True, precision="fp32-low-rank",
            description="HF optim=galore_adamw_layerwise: galore_adamw, each parameter stepped inside backward"),
    _galore("galore_adamw_8bit_layerwise", "GaLoreAdamW8bit", _GALORE_8BIT, hf=True, layerwise=True,
            shared=bnb_shared(2), precision="int8-low-rank", needs_cuda=GALORE_8BIT_CUDA,
            description="HF optim=galore_adamw_8bit_layerwise: galore_adamw_8bit stepped inside backward"),
    _galore("galore_adafactor_layerwise", "GaLoreAdafactor", _GALORE_ADAFACTOR, hf=True, layerwise=True,
            precision="factored-low-rank", broken=GALORE_ADAFACTOR_LAYERWISE, default_lr=3e-4, lr_range=(3e-5, 3e-3),
            description="HF optim=galore_adafactor_layerwise: galore_adafactor stepped inside backward"),
    _entry("apollo_adamw", "apollo_torch", "APOLLOAdamW", "apollo", _HF_APOLLO_GROUP, _APOLLO, hf_alias="apollo_adamw",
           default_kwargs=_HF_APOLLO, precision="fp32-low-rank",
           description="HF optim=apollo_adamw: APOLLO AdamW, rank 128 on every nn.Linear weight"),
    _entry("apollo_adamw_layerwise", "apollo_torch", "APOLLOAdamW", "apollo", _HF_APOLLO_GROUP, _APOLLO,
           layerwise=True, hf_alias="apollo_adamw_layerwise", default_kwargs=_HF_APOLLO, precision="fp32-low-rank",
           description="HF optim=apollo_adamw_layerwise: apollo_adamw, each parameter stepped inside backward"),
]
