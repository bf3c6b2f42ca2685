"""The optimizer registry: one table that the CLI, the trial, the tests and the benchmarks iterate over.

Each entry knows how to build its optimizer, which library it needs, the learning rate it wants for
fine-tuning, a short label for how it stores its state, and how many state bytes it *should* hold for a
given set of parameter shapes. The analytic count is written to match the measured one byte for byte,
so a mismatch in a record points at a real change in the library, not at rounding.

Optional libraries are imported only inside factories and availability checks: importing this module
never imports bitsandbytes (5 s) or torchao, and a missing library makes an entry unavailable with a
reason instead of breaking the import.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Shape = Sequence[int]
FP32_BYTES = 4

# bitsandbytes keeps 8-bit state only for tensors with at least this many elements (min_8bit_size).
BNB_MIN_8BIT_NUMEL = 4096
# Blockwise quantisation: one fp32 absmax per block of this many elements (bitsandbytes' CPU and CUDA default).
BNB_BLOCK_SIZE = 256
# Two 256-entry fp32 quantisation maps (one per moment), shared by every parameter of one optimizer.
BNB_QMAP_BYTES = 2 * 256 * FP32_BYTES


NOMINAL_SHAPE = (1024, 1024)


@dataclass(frozen=True)
class AnalyticState:
    """What an entry's state should be for a model: bytes, the parameters whose state stays full
    precision, and the bytes one optimizer.step() must read and write."""

    state_bytes: int
    fp32_state_numel: int
    step_traffic_bytes: int


def factored_numel(shapes: Sequence[Shape]) -> int:
    """Σ rows + columns over tensors of rank >= 2 (numel for vectors): what a factored second moment keeps.

    Adafactor stores a row and a column statistic per matrix instead of one value per element, so its
    state grows with this count, not with the parameter count (scaling.py fits it against this).
    """
    total = 0
    for shape in shapes:
        if len(shape) >= 2:
            total += math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]
        else:
            total += math.prod(shape)
    return total


class UnknownOptimizerError(ValueError):
    """Raised for a name that is neither registered nor an alias; the message lists the known names."""


@dataclass(frozen=True)
class OptimizerSpec:
    name: str
    factory: Callable[..., Any]
    library: str
    default_lr: float
    precision: str
    analytic_state_bytes: Callable[[list[Shape]], int]
    aliases: tuple[str, ...] = ()
    description: str = ""
    default_kwargs: dict[str, Any] | None = None

    def unavailable_reason(self) -> str | None:
        """None when the entry can be built here, else why not (a missing library)."""
        module = self.library.split(">")[0].strip().replace("-", "_")
        if importlib.util.find_spec(module) is None:
            return f"needs `pip install {self.library}`"
        return None

    @property
    def nominal_bytes_per_param(self) -> float:
        """State bytes per parameter of one 1024 x 1024 weight matrix: the figure to quote for big models
        (the exact count for a given model comes from `analytic_state_bytes` on its shapes)."""
        return self.analytic_state_bytes([NOMINAL_SHAPE]) / math.prod(NOMINAL_SHAPE)

    @property
    def available(self) -> bool:
        return self.unavailable_reason() is None

    def build(self, params: Iterable[Any], lr: float | None = None, **kwargs: Any) -> Any:
        """Build the optimizer; lr defaults to the entry's fine-tuning learning rate."""
        merged = {**(self.default_kwargs or {}), **kwargs}
        return self.factory(params, lr=self.default_lr if lr is None else lr, **merged)

    def build_for(self, model: Any, lr: float | None = None, **kwargs: Any) -> Any:
        """Build the optimizer over a model's trainable parameters."""
        return self.build([p for p in model.parameters() if p.requires_grad], lr=lr, **kwargs)

    def analytic_for(self, model: Any) -> AnalyticState:
        params = [p for p in model.parameters() if p.requires_grad]
        state = self.analytic_state_bytes([tuple(p.shape) for p in params])
        numel = sum(p.numel() for p in params)
        return AnalyticState(state_bytes=state, fp32_state_numel=numel if self.precision == "fp32" else 0,
                             step_traffic_bytes=2 * state + 3 * FP32_BYTES * numel)

    def before_eval(self, optimizer: Any) -> None:
        """Hook around evaluation (schedule-free optimizers switch their weights); a no-op by default."""

    def after_eval(self, optimizer: Any) -> None:
        """Undo `before_eval`."""

    def paging(self, optimizer: Any) -> tuple[bool | None, str | None]:
        """(paged, why not) for paged optimizers; (None, None) for the others."""
        return None, None


def _numel(shape: Shape) -> int:
    return math.prod(shape)


def _adamw_state_bytes(shapes: list[Shape]) -> int:
    # exp_avg + exp_avg_sq in fp32, plus torch's per-parameter fp32 `step` tensor.
    return sum(2 * FP32_BYTES * _numel(s) + FP32_BYTES for s in shapes)


def _bnb_8bit_state_bytes(shapes: list[Shape]) -> int:
    total, any_8bit = 0, False
    for shape in shapes:
        n = _numel(shape)
        if n >= BNB_MIN_8BIT_NUMEL:
            any_8bit = True
            total += 2 * n + 2 * FP32_BYTES * math.ceil(n / BNB_BLOCK_SIZE)  # uint8 moments + absmax
        else:
            total += 2 * FP32_BYTES * n  # small tensors keep fp32 moments
    return total + (BNB_QMAP_BYTES if any_8bit else 0)


def _adafactor_state_bytes(shapes: list[Shape]) -> int:
    # transformers' Adafactor without momentum: a factored second moment (row + column statistics) for
    # tensors of rank >= 2, a full one for vectors, and one fp32 RMS scalar per parameter.
    return FP32_BYTES * (factored_numel(shapes) + len(shapes))


def _make_adamw(params: Iterable[Any], lr: float, **kwargs: Any) -> Any:
    import torch

    return torch.optim.AdamW(params, lr=lr, **kwargs)


def _make_adafactor(params: Iterable[Any], lr: float, **kwargs: Any) -> Any:
    from transformers.optimization import Adafactor

    # An external learning rate (as a scheduler would drive it), no relative-step heuristics, no
    # momentum: this is the memory-lean configuration people pick Adafactor for.
    settings = dict(relative_step=False, scale_parameter=False, warmup_init=False, beta1=None)
    return Adafactor(params, lr=lr, **{**settings, **kwargs})


def _make_bnb_adamw8bit(params: Iterable[Any], lr: float, **kwargs: Any) -> Any:
    # On CPUs with AVX512-BF16, importing bitsandbytes tries to fetch a 4-bit inference kernel from the
    # hub and logs a warning when it cannot; the optimizers do not use that kernel.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    import bitsandbytes as bnb

    return bnb.optim.AdamW8bit(params, lr=lr, **kwargs)


def _torchao_state_bytes(bits: int, block_size: int) -> Callable[[list[Shape]], int]:
    # torchao quantises tensors of at least 4096 elements whose size is a multiple of the block: per
    # moment, `bits` per element + one fp32 scale per block + its own 2**bits-entry fp32 quantisation
    # map (not shared between tensors, unlike bitsandbytes'); a float32 step per parameter; smaller
    # tensors stay fp32. Checked against torchao 0.18 on CPU.
    qmap_bytes = FP32_BYTES * 2**bits

    def count(shapes: list[Shape]) -> int:
        total = 0
        for shape in shapes:
            n = _numel(shape)
            if n >= 4096 and n % block_size == 0:
                total += 2 * (n * bits // 8 + FP32_BYTES * (n // block_size) + qmap_bytes)
            else:
                total += 2 * FP32_BYTES * n
            total += FP32_BYTES
        return total

    return count


def _torchao_entry(bits: int, block_size: int) -> OptimizerSpec:
    """torchao's low-bit AdamW (`AdamW8bit`, `AdamW4bit`): tensor-subclass state, compiled on first step."""
    class_name = f"AdamW{bits}bit"

    def make(params: Iterable[Any], lr: float, **kwargs: Any) -> Any:
        from torchao import optim as ao_optim

        return getattr(ao_optim, class_name)(params, lr=lr, **kwargs)

    return OptimizerSpec(
        name=f"adamw{bits}bit_torchao",
        aliases=(f"adamw_torch_{bits}bit",),
        factory=make,
        library="torchao",
        default_lr=5e-5,
        precision=f"int{bits}-blockwise",
        analytic_state_bytes=_torchao_state_bytes(bits, block_size),
        description=f"torchao {class_name} (tensor-subclass state; compiles on its first step)",
    )


REGISTRY: dict[str, OptimizerSpec] = {
    spec.name: spec
    for spec in [
        OptimizerSpec(
            name="adamw",
            aliases=("adamw_torch", "adamw_torch_fused"),
            factory=_make_adamw,
            library="torch",
            default_lr=5e-5,
            precision="fp32",
            analytic_state_bytes=_adamw_state_bytes,
            description="torch.optim.AdamW: two fp32 moments per parameter (the reference)",
        ),
        OptimizerSpec(
            name="adafactor",
            aliases=("adafactor_hf",),
            factory=_make_adafactor,
            library="transformers",
            # Without momentum or parameter scaling Adafactor's update is RMS-clipped to ~lr per element,
            # so it wants a larger lr than AdamW for the same progress.
            default_lr=3e-4,
            precision="factored",
            analytic_state_bytes=_adafactor_state_bytes,
            description="transformers Adafactor, external lr, no momentum: row+column second moment",
        ),
        OptimizerSpec(
            name="adamw8bit",
            aliases=("adamw_bnb_8bit", "adamw_8bit"),
            factory=_make_bnb_adamw8bit,
            library="bitsandbytes",
            default_lr=5e-5,
            precision="int8-blockwise",
            analytic_state_bytes=_bnb_8bit_state_bytes,
            description="bitsandbytes AdamW8bit: uint8 moments, fp32 absmax per 256-block",
        ),
        _torchao_entry(bits=8, block_size=256),
        _torchao_entry(bits=4, block_size=128),
    ]
}

DEFAULT_OPTIMIZERS: tuple[str, ...] = ("adamw", "adafactor", "adamw8bit")


def resolve(name: str) -> OptimizerSpec:
    """Look a name or an HF Trainer alias up; unknown names fail with the list of known ones."""
    key = name.strip().lower()
    for spec in REGISTRY.values():
        if key == spec.name or key in spec.aliases:
            return spec
    known = ", ".join(f"{s.name} ({'/'.join(s.aliases)})" if s.aliases else s.name for s in REGISTRY.values())
    raise UnknownOptimizerError(f"unknown optimizer '{name}'; known: {known}")
