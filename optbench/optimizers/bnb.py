"""bitsandbytes entries: 8-bit blockwise AdamW/Adam/Lion/AdEMAMix/RMSprop, the paged variants, and
`adamw8bit_hf`, which is what HF Trainer's `optim="adamw_bnb_8bit"` actually builds.

bitsandbytes' state is fp32 or uint8 whatever the parameter dtype. An 8-bit state tensor costs one byte
per element per moment plus one fp32 absmax per 256-element block; the 256-entry fp32 quantisation maps
(one per moment kind, at most two) are shared by every parameter of one optimizer and counted once.
Tensors under `min_8bit_size` (4096) elements keep fp32 state.

HF Trainer, for any bitsandbytes optimizer with 8-bit state, registers an `optim_bits=32` override for
the weight of every nn.Embedding with bitsandbytes' GlobalOptimManager: embeddings keep fp32 Adam state
(more memory, the stability the LLM.int8 authors recommend). `adamw8bit` is the pure library optimizer;
`adamw8bit_hf` reproduces the Trainer. The manager is a process-wide singleton whose overrides would
reach every later bitsandbytes optimizer over the same tensors, so every optimizer built here gets a
private manager instead: overrides never leak between optimizers, and an override someone else put in
the global one (a Trainer in the same process) never reaches ours.

HF's names (`paged_adamw_8bit`, `lion_8bit`, `rmsprop_bnb`, `ademamix`, ...) build bitsandbytes' AdamW, Lion,
RMSprop or AdEMAMix class with `optim_bits` and `is_paged` and Trainer's settings (optimizers/hf.py), the 8-bit ones
with the embedding override: `_hf_entry`. On a CPU build bitsandbytes keeps paged AdamW and Lion state in ordinary
tensors; its paged AdEMAMix asks for CUDA managed memory and fails, so those two names need CUDA.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from optbench.optimizers.base import (
    FP32,
    FP32_BYTES,
    OptimizerSpec,
    Param,
    ParamState,
    full_moments,
    param_state,
)
from optbench.optimizers.hf import HF_ADAM, HF_WEIGHT_DECAY
from optbench.optimizers.torch_optim import ADAMW_LR_RANGE, RMSPROP_LR

BNB_MIN_8BIT_NUMEL = 4096
BNB_BLOCK_SIZE = 256
BNB_QMAP_BYTES = 256 * FP32_BYTES
# bitsandbytes pages (CUDA unified memory) only state tensors of at least this many elements.
BNB_MIN_PAGED_NUMEL = 100_000
LION_LR = dict(default_lr=1e-5, lr_range=(2e-6, 1e-4))  # sign updates: ~3-10x below AdamW's lr


def bnb_rule(moments: int, bits8: bool, embeddings_fp32: bool = False):
    """The rule for an optimizer with `moments` state tensors per parameter (AdEMAMix has three)."""

    def rule(p: Param, min_8bit_size: int = BNB_MIN_8BIT_NUMEL, **_: Any) -> ParamState:
        if not bits8:
            return full_moments(p, moments, "fp32 (32-bit optimizer)", fp32=True)
        if p.numel < min_8bit_size:
            return full_moments(p, moments, f"fp32: under {min_8bit_size} elements", fp32=True)
        if embeddings_fp32 and p.embedding:
            return full_moments(p, moments, "fp32: embedding override (HF)", fp32=True)
        absmax_bytes = FP32_BYTES * math.ceil(p.numel / BNB_BLOCK_SIZE)
        return param_state("8-bit", ("uint8", moments * p.numel), (FP32, moments * absmax_bytes))

    return rule


def bnb_shared(moments: int):
    """The quantisation maps (one per moment kind, at most two), shared by every parameter with 8-bit state."""

    def shared(states: list[ParamState], **_: Any) -> ParamState | None:
        if not any("uint8" in state.bytes_by_dtype for state in states):
            return None
        return param_state("8-bit quantisation maps", (FP32, min(moments, 2) * BNB_QMAP_BYTES))

    return shared


def _private_manager() -> Any:
    from bitsandbytes.optim import GlobalOptimManager

    manager = GlobalOptimManager.__new__(GlobalOptimManager)  # get_instance() would hand out the singleton
    manager.initialize()
    return manager


def _import_bnb() -> Any:
    # On CPUs with AVX512-BF16, importing bitsandbytes tries to fetch a 4-bit inference kernel from the
    # hub and logs a warning when it cannot; the optimizers do not use that kernel.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    import bitsandbytes

    return bitsandbytes


def _factory(class_name: str):
    def make(params: Any, lr: float, **kwargs: Any) -> Any:
        optimizer = getattr(_import_bnb().optim, class_name)(params, lr=lr, **kwargs)
        optimizer.mng = _private_manager()
        return optimizer

    return make


def _trainer_factory(class_name: str):
    """bitsandbytes' `class_name` built as transformers' Trainer.create_optimizer builds it: with `optim_bits=8`,
    every nn.Embedding weight is overridden to 32-bit state."""

    def make(pairs: list[tuple[Param, Any]], lr: float, **kwargs: Any) -> Any:
        optimizer = _factory(class_name)([t for _, t in pairs], lr=lr, **kwargs)
        if kwargs.get("optim_bits") == 8:
            for facts, tensor in pairs:
                if facts.embedding:
                    optimizer.mng.override_config(tensor, key_value_dict={"optim_bits": 32})
        return optimizer

    return make


def _paging(optimizer: Any) -> tuple[bool | None, str | None]:
    """Whether a paged optimizer really pages: True once any state tensor lives in paged memory."""
    tensors = [v for state in optimizer.state.values() for v in state.values() if hasattr(v, "is_paged")]
    if any(t.is_paged for t in tensors):
        return True, None
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if params and params[0].device.type != "cuda":
        return False, f"bitsandbytes pages only CUDA state; on {params[0].device.type} it keeps ordinary tensors"
    if not optimizer.state:
        return False, "no state yet: paging is decided on the first step"
    return False, f"no parameter has {BNB_MIN_PAGED_NUMEL:,} elements, the least bitsandbytes pages"


NO_DTENSOR = ("bitsandbytes' update kernels take no DTensor parameters (8-bit: 'got mixed torch.Tensor and DTensor'; "
              "32-bit: 'no sharding strategy registered')")


def _entry(name: str, class_name: str, moments: int, bits8: bool, **fields: Any) -> OptimizerSpec:
    defaults = dict(default_lr=5e-5, lr_range=ADAMW_LR_RANGE, fsdp2=NO_DTENSOR)
    return OptimizerSpec(
        name=name, factory=_factory(class_name), library="bitsandbytes",
        precision="int8-blockwise" if bits8 else "fp32", rule=bnb_rule(moments, bits8), shared=bnb_shared(moments),
        **{**defaults, **fields},
    )


# What Trainer passes besides lr and the bits, per class (TrainingArguments' defaults; RMSprop gets optim_args only).
_TRAINER_KWARGS = {
    "AdamW": dict(HF_ADAM),
    "Lion": {"betas": (0.9, 0.999), "weight_decay": HF_WEIGHT_DECAY},  # Trainer hands Lion Adam's betas
    "RMSprop": {"weight_decay": HF_WEIGHT_DECAY},
    "AdEMAMix": {"betas": (0.9, 0.999, 0.9999), "alpha": 5.0, "eps": 1e-8, "weight_decay": HF_WEIGHT_DECAY},
}
_MOMENTS = {"AdamW": 2, "Lion": 1, "RMSprop": 1, "AdEMAMix": 3}
PAGED_ADEMAMIX_CPU = ("needs CUDA: bitsandbytes' paged AdEMAMix asks for CUDA managed memory on a CPU build too "
                      "(cget_managed_ptr), where paged AdamW and Lion fall back to ordinary tensors")


def _hf_entry(name: str, class_name: str, bits: int, paged: bool, **fields: Any) -> OptimizerSpec:
    """HF Trainer's `optim=name`: bitsandbytes' `class_name` with `optim_bits=bits`, `is_paged=paged` (RMSprop takes
    no is_paged), Trainer's settings, and for 8 bits the embedding override."""
    moments, bits8 = _MOMENTS[class_name], bits == 8
    settings = {**_TRAINER_KWARGS[class_name], "optim_bits": bits, **({} if class_name == "RMSprop" else
                                                                      {"is_paged": paged})}
    lr = LION_LR if class_name == "Lion" else RMSPROP_LR if class_name == "RMSprop" else {}
    base = dict(hf_alias=name, **{"default_lr": 5e-5, "lr_range": ADAMW_LR_RANGE, **lr}, fsdp2=NO_DTENSOR,
                **({"paging": _paging} if paged else {}),
                description=f"HF optim={name}: bitsandbytes {class_name}(optim_bits={bits}"
                            f"{', is_paged=True' if paged else ''})" + (", nn.Embedding weights fp32" if bits8 else ""))
    return OptimizerSpec(
        name=name, factory=_trainer_factory(class_name), structural=True, library="bitsandbytes",
        precision="int8-blockwise, fp32 embeddings" if bits8 else "fp32",
        rule=bnb_rule(moments, bits8, embeddings_fp32=True), shared=bnb_shared(moments), default_kwargs=settings,
        **{**base, **fields},
    )


# HF's names for the 8-bit ones other than AdamW (paged_adamw_8bit, lion_8bit, ademamix_8bit, rmsprop_bnb_8bit)
# also keep embeddings 32-bit, so they are not aliases of these pure entries.
BNB_ENTRIES = [
    _entry("adamw8bit", "AdamW8bit", 2, True,
           description="bitsandbytes AdamW8bit as the library ships it: uint8 moments for every tensor "
                       ">= 4096 elements, embeddings included"),
    _hf_entry("adamw8bit_hf", "AdamW", 8, False, hf_alias="adamw_bnb_8bit", aliases=("adamw_8bit",),
              description="what HF Trainer builds for optim=adamw_bnb_8bit: AdamW8bit but nn.Embedding weights "
                          "keep fp32 state, weight decay 0"),
    _entry("adam8bit", "Adam8bit", 2, True, description="bitsandbytes Adam8bit (L2 penalty, not decoupled decay)"),
    _entry("paged_adamw8bit", "PagedAdamW8bit", 2, True, paging=_paging,
           description="bitsandbytes PagedAdamW8bit: 8-bit state in CUDA unified memory (pages to host)"),
    _entry("paged_adamw", "PagedAdamW", 2, False, paging=_paging,
           description="bitsandbytes PagedAdamW: fp32 state in CUDA unified memory (pages to host)"),
    _entry("lion8bit", "Lion8bit", 1, True, **LION_LR, description="bitsandbytes Lion8bit: one uint8 momentum"),
    _entry("lion", "Lion", 1, False, **LION_LR, description="bitsandbytes Lion (32-bit): one fp32 momentum"),
    _entry("ademamix8bit", "AdEMAMix8bit", 3, True,
           description="bitsandbytes AdEMAMix8bit: fast and slow first moments + second moment, uint8"),
    _entry("rmsprop8bit", "RMSprop8bit", 1, True, **RMSPROP_LR,
           description="bitsandbytes RMSprop8bit: one uint8 second moment"),
    _hf_entry("paged_adamw_8bit", "AdamW", 8, True),
    _hf_entry("paged_adamw_32bit", "AdamW", 32, True),
    _hf_entry("lion_8bit", "Lion", 8, False),
    _hf_entry("lion_32bit", "Lion", 32, False),
    _hf_entry("paged_lion_8bit", "Lion", 8, True),
    _hf_entry("paged_lion_32bit", "Lion", 32, True),
    _hf_entry("rmsprop_bnb", "RMSprop", 32, False),
    _hf_entry("rmsprop_bnb_8bit", "RMSprop", 8, False),
    _hf_entry("rmsprop_bnb_32bit", "RMSprop", 32, False),
    _hf_entry("ademamix", "AdEMAMix", 32, False),
    _hf_entry("ademamix_8bit", "AdEMAMix", 8, False),
    _hf_entry("paged_ademamix_32bit", "AdEMAMix", 32, True, needs_cuda=PAGED_ADEMAMIX_CPU),
    _hf_entry("paged_ademamix_8bit", "AdEMAMix", 8, True, needs_cuda=PAGED_ADEMAMIX_CPU),
]
