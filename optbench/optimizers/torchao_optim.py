"""torchao's low-bit AdamW (`pip install "optbench[torchao]"`): tensor-subclass state, compiled on the first step.

The pure entries take torchao's own defaults (weight decay 1e-2, 128-element blocks for 4 bits); HF Trainer's
`adamw_torch_8bit` / `adamw_torch_4bit` pass 256-element blocks, no bf16 stochastic rounding and Trainer's Adam
settings (optimizers/hf.py). Under FSDP2 torchao applies its quantisation rule to each rank's local shard, so a
shard that its block no longer divides keeps full-precision moments (optbench.memory.sharding).
"""

from __future__ import annotations

from typing import Any

from optbench.optimizers.base import (
    FP32,
    FP32_BYTES,
    STEP,
    OptimizerSpec,
    Param,
    ParamState,
    full_moments,
    param_state,
    short_dtype,
)
from optbench.optimizers.hf import HF_ADAM
from optbench.optimizers.torch_optim import ADAMW_LR_RANGE

TORCHAO_MIN_QUANT_NUMEL = 4096


def _torchao_rule(code_bits: int, code_dtype: str, default_block_size: int, qmap_entries: int, label: str):
    """torchao quantises tensors of >= 4096 elements that its block divides: per moment, `code_bits`
    per element (`code_dtype` codes) + one fp32 scale per block + its own fp32 quantisation map
    (`qmap_entries` values, none for fp8; not shared between tensors, unlike bitsandbytes'). Other
    tensors keep moments in the parameter's dtype. A 0-d fp32 `step` per parameter."""

    def rule(p: Param, block_size: int = default_block_size, **_: Any) -> ParamState:
        if p.numel < TORCHAO_MIN_QUANT_NUMEL:
            return full_moments(p, 2, f"{short_dtype(p.dtype_name)}: under {TORCHAO_MIN_QUANT_NUMEL} elements", STEP)
        if p.numel % block_size:
            return full_moments(p, 2, f"{short_dtype(p.dtype_name)}: block size does not divide", STEP)
        codes = (code_dtype, 2 * (p.numel * code_bits // 8))
        return param_state(label, codes, (FP32, 2 * FP32_BYTES * (p.numel // block_size + qmap_entries)), STEP)

    return rule


def _factory(class_name: str):
    def make(params: Any, lr: float, **kwargs: Any) -> Any:
        from torchao import optim as ao_optim

        return getattr(ao_optim, class_name)(params, lr=lr, **kwargs)

    return make


def _entry(class_name: str, name: str, precision: str, rule: Any, **fields: Any) -> OptimizerSpec:
    return OptimizerSpec(
        name=name, factory=_factory(class_name), library="torchao", extra="torchao", default_lr=5e-5,
        lr_range=ADAMW_LR_RANGE, precision=precision, rule=rule, fsdp2="local",
        **{"description": f"torchao {class_name}: tensor-subclass state, compiled on its first step", **fields},
    )


_RULE_8BIT = _torchao_rule(8, "uint8", default_block_size=256, qmap_entries=256, label="8-bit")
_RULE_4BIT = _torchao_rule(4, "uint8", default_block_size=128, qmap_entries=16, label="4-bit")
# HF_ADAM, 256-element blocks, no bf16 stochastic rounding: Trainer's _get_torchao_optimizer without optim_args.
_TRAINER = {**HF_ADAM, "block_size": 256, "bf16_stochastic_round": False}

TORCHAO_ENTRIES = [
    _entry("AdamW8bit", "adamw8bit_torchao", "int8-blockwise", _RULE_8BIT),
    _entry("AdamW4bit", "adamw4bit_torchao", "int4-blockwise", _RULE_4BIT),
    _entry("AdamWFp8", "adamw_fp8_torchao", "fp8-e4m3-blockwise",
           _torchao_rule(8, "float8_e4m3fn", default_block_size=256, qmap_entries=0, label="fp8")),
    _entry("AdamW8bit", "adamw_torch_8bit", "int8-blockwise", _RULE_8BIT, hf_alias="adamw_torch_8bit",
           default_kwargs=_TRAINER, description="HF optim=adamw_torch_8bit: torchao AdamW8bit, 256-element blocks, "
                                                "weight decay 0"),
    _entry("AdamW4bit", "adamw_torch_4bit", "int4-blockwise", _RULE_4BIT, hf_alias="adamw_torch_4bit",
           default_kwargs=_TRAINER, description="HF optim=adamw_torch_4bit: torchao AdamW4bit with HF's 256-element "
                                                "blocks (torchao's own: 128), weight decay 0"),
]
