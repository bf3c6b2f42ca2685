"""One registry entry (`OptimizerSpec`), the facts its analytic state rule works from, and the state map.

An entry's analytic state is a per-parameter rule: `rule(param, **settings) -> ParamState`, the state
one `Param` gets (bytes per dtype, why in a few words, its full-size fp32 share), plus an optional
optimizer-wide `shared(states, **settings)` row (bitsandbytes' quantisation maps, shared by every 8-bit
tensor). The rule is the single source of truth: `count` and `analytic_for` are sums over the map it
makes (`state_map`), and `optbench explain` prints the map itself.

A rule reads `Param` facts: shape, element size, and the two structural roles some
optimizers treat differently (embeddings, the output head). The facts come from a model
(`describe_model`) when the trial has one, or from bare shapes (`Param.from_shape`) for the estimate and
scaling code that has only shapes; entries that need structure then fall back to a shapes-only rule,
the same one their `build` uses on a bare parameter list, so a count and a build always agree.

`fp32_state_numel` counts the parameters an entry leaves on full-size fp32 state: not compressed by its
memory-saving scheme (quantisation, factoring, low-rank projection) nor moved to another update rule
(Muon's hidden matrices). For a plain entry it is every parameter whose state is fp32; bf16 parameters
under torch's AdamW keep bf16 moments and so count zero.

`step_traffic_bytes` is the same model for every family: one optimizer.step() reads and writes every
parameter (2 x weights), reads every gradient once (gradients share the parameters' dtype), and reads
and writes the whole state once (2 x state). It is the unavoidable memory traffic, a floor that ignores
caches and temporaries: AdamW's fp32 state dominates it; quantised entries trade state bytes for
(de)quantisation compute; factored and low-rank entries also build full-size temporaries (the factored
second moment, the projected gradient) that this floor does not charge.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

Shape = Sequence[int]
FP32_BYTES = 4
# A 1024 x 1024 fp32 weight matrix: the shape behind the nominal bytes/param quoted for big models.
NOMINAL_SHAPE = (1024, 1024)
# Top-level module names that hold a model's output head (the classifier of a BERT, a causal LM's
# lm_head, ...): optimizers such as Muon leave them to AdamW, like the embeddings.
HEAD_MODULE_NAMES = frozenset({"classifier", "lm_head", "score", "qa_outputs", "head", "cls"})
# The kinds of module a parameter belongs to, in the order maps and figures list them: the keys of
# `Record.state_bytes_by_module` (optbench/memory/statemap.py sorts parameters into them, the report draws them).
MODULE_KINDS = ("embeddings", "attention", "mlp", "norms/biases", "head")


class UnknownOptimizerError(ValueError):
    """Raised for a name that is neither registered nor an alias; the message lists the known names."""


@dataclass(frozen=True)
class Param:
    """What an analytic count needs to know about one trainable parameter."""

    shape: tuple[int, ...]
    itemsize: int = FP32_BYTES  # bytes per element of the parameter's dtype (2 for bf16)
    name: str = ""  # qualified name from named_parameters(); "" when only the shape is known
    embedding: bool = False  # the weight of an nn.Embedding
    head: bool = False  # part of the output head (see HEAD_MODULE_NAMES) or the output embeddings
    dtype: str = ""  # torch's dtype name without "torch."; "" when only the itemsize is known
    linear: bool | None = None  # the weight of an nn.Linear; None when only the shape is known
    layer_norm: bool = False  # a parameter of an nn.LayerNorm (HF Trainer never decays those)

    @classmethod
    def from_shape(cls, shape: Shape) -> Param:
        return cls(shape=tuple(int(d) for d in shape))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def dtype_name(self) -> str:
        """The dtype's name; from the itemsize alone, 2 bytes reads as bfloat16 (the half type people train in)."""
        return self.dtype or _DTYPE_BY_ITEMSIZE.get(self.itemsize, f"{self.itemsize}-byte")

    @property
    def hidden_matrix(self) -> bool:
        """A 2-D weight inside the model body: what Muon orthogonalises and GaLore projects."""
        return len(self.shape) == 2 and not self.embedding and not self.head

    @property
    def linear_weight(self) -> bool:
        """The weight of an nn.Linear (what HF's `optim_target_modules` selects); from the shape alone, any 2-D."""
        return len(self.shape) == 2 if self.linear is None else self.linear

    @property
    def role(self) -> str:
        """Why a structural rule treats this parameter as it does: embedding, head, vector, hidden matrix or N-D."""
        if self.embedding:
            return "embedding"
        if self.head:
            return "head"
        if len(self.shape) < 2:
            return "vector"
        return "hidden matrix" if len(self.shape) == 2 else f"{len(self.shape)}-D"


_DTYPE_BY_ITEMSIZE = {FP32_BYTES: "float32", 2: "bfloat16", 8: "float64", 1: "uint8"}
FP32 = "float32"
STEP = (FP32, FP32_BYTES)  # torch's per-parameter 0-d fp32 `step` tensor, as a (dtype, bytes) part


def factored_numel(shapes: Sequence[Shape]) -> int:
    """Σ rows + columns over tensors of rank >= 2 (numel for vectors): what a factored second moment keeps.

    Adafactor stores a row and a column statistic per matrix instead of one value per element, so its
    state grows with this count, not with the parameter count (scaling.py fits it against this).
    """
    return sum(math.prod(s) // s[-1] + math.prod(s) // s[-2] if len(s) >= 2 else math.prod(s) for s in shapes)


def describe_model(model: Any) -> list[tuple[Param, Any]]:
    """(facts, tensor) for each trainable parameter of `model`, in `model.parameters()` order."""
    import torch

    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    linear_ids = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    norm_ids = {id(p) for m in model.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters()}
    head_ids: set[int] = set()
    output_embeddings = getattr(model, "get_output_embeddings", lambda: None)()
    if output_embeddings is not None:
        head_ids |= {id(p) for p in output_embeddings.parameters()}
    pairs = []
    for name, tensor in model.named_parameters():
        if not tensor.requires_grad:
            continue
        head = id(tensor) in head_ids or name.split(".")[0] in HEAD_MODULE_NAMES
        facts = Param(shape=tuple(tensor.shape), itemsize=tensor.element_size(), name=name,
                      embedding=id(tensor) in embedding_ids, head=head, dtype=dtype_name(tensor.dtype),
                      linear=id(tensor) in linear_ids, layer_norm=id(tensor) in norm_ids)
        pairs.append((facts, tensor))
    return pairs


def describe_tensors(params: Iterable[Any]) -> list[tuple[Param, Any]]:
    """(facts, tensor) for a bare parameter list, or param groups (ZeroRedundancyOptimizer hands a rank's share so):
    shapes and dtypes, no structure."""
    tensors = [t for item in params for t in (item["params"] if isinstance(item, dict) else [item])]
    return [(Param(shape=tuple(p.shape), itemsize=p.element_size(), dtype=dtype_name(p.dtype)), p) for p in tensors]


def dtype_name(dtype: Any) -> str:
    """torch.float32 -> "float32": the spelling state maps and their CSV use."""
    return str(dtype).removeprefix("torch.")


def short_dtype(name: str) -> str:
    """float32 -> fp32, bfloat16 -> bf16, float16 -> fp16, float8_e4m3fn -> fp8_e4m3fn: for `why` texts and tables."""
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(name, name.replace("float8", "fp8"))


@dataclass(frozen=True)
class Count:
    """An analytic count: state bytes, and the numel of parameters left on full-size fp32 state."""

    state_bytes: int = 0
    fp32_state_numel: int = 0

    def __add__(self, other: Count) -> Count:
        return Count(self.state_bytes + other.state_bytes, self.fp32_state_numel + other.fp32_state_numel)


@dataclass(frozen=True)
class ParamState:
    """The state a rule gives one parameter (or the optimizer-wide shared row): bytes per state dtype, why
    in a few words, and how many of the parameter's elements sit on full-size fp32 state (module docstring)."""

    bytes_by_dtype: dict[str, int]
    why: str
    fp32_state_numel: int = 0

    @property
    def state_bytes(self) -> int:
        return sum(self.bytes_by_dtype.values())

    @property
    def count(self) -> Count:
        return Count(self.state_bytes, self.fp32_state_numel)


def param_state(why: str, *parts: tuple[str, int], fp32_state_numel: int = 0) -> ParamState:
    """A ParamState from (dtype, bytes) parts; parts of one dtype add up, empty ones drop out."""
    bytes_by_dtype: dict[str, int] = {}
    for dtype, nbytes in parts:
        if nbytes:
            bytes_by_dtype[dtype] = bytes_by_dtype.get(dtype, 0) + nbytes
    return ParamState(bytes_by_dtype, why, fp32_state_numel)


def full_moments(p: Param, moments: int, why: str, *extra: tuple[str, int], fp32: bool = False) -> ParamState:
    """`moments` state tensors shaped like `p`, in the parameter's dtype (in fp32 with `fp32=True`), plus
    `extra` parts: full-size state, so it counts as fp32 state exactly when it is fp32."""
    dtype, itemsize = (FP32, FP32_BYTES) if fp32 else (p.dtype_name, p.itemsize)
    return param_state(why, (dtype, moments * itemsize * p.numel), *extra,
                       fp32_state_numel=p.numel if dtype == FP32 else 0)


@dataclass(frozen=True)
class StateMap:
    """An entry's analytic state for a list of parameters: one ParamState each, plus the shared row."""

    params: list[tuple[Param, ParamState]]
    shared: ParamState | None = None

    @property
    def count(self) -> Count:
        counts = [state.count for _, state in self.params]
        return sum(counts, self.shared.count if self.shared is not None else Count())


@dataclass(frozen=True)
class AnalyticState:
    """What an entry's analytic count says about one model (see the module docstring for each field)."""

    state_bytes: int
    fp32_state_numel: int
    step_traffic_bytes: int
    trainable_numel: int

    @property
    def fp32_state_fraction(self) -> float:
        return self.fp32_state_numel / self.trainable_numel if self.trainable_numel else 0.0


def lr_grid(low: float, high: float, default: float, points: int) -> list[float]:
    """`points` learning rates log-spaced over [low, high], the one nearest `default` replaced by it.

    Rounded to three significant digits so that grids read well in tables and trial ids stay stable.
    """
    if points < 1:
        raise ValueError(f"an lr grid needs at least one point, got {points}")
    if points == 1:
        return [default]
    ratio = math.log(high / low)
    grid = [float(f"{low * math.exp(ratio * i / (points - 1)):.3g}") for i in range(points)]
    nearest = min(range(points), key=lambda i: abs(math.log(grid[i] / default)))
    grid[nearest] = default
    return sorted(set(grid))


def _no_paging(_: Any) -> tuple[bool | None, str | None]:
    return None, None


def _no_hook(_: Any) -> None:
    return None


def no_shared(_: list[ParamState], **__: Any) -> ParamState | None:
    return None


@dataclass(frozen=True)
class OptimizerSpec:
    """One registry entry.

    `factory(params, lr, **kwargs)` builds the optimizer from a parameter list. An entry whose
    optimizer depends on module structure sets `structural=True`: its factory then takes
    `(pairs, lr, **kwargs)`, pairs being `(Param, tensor)` from `describe_model` (or from bare tensors,
    where the structure is unknown). `rule(param, **settings)` is the analytic state of one parameter and
    `shared(states, **settings)` the optimizer-wide row (see the module docstring); they see the same
    settings (default_kwargs merged with the caller's) as the factory. Only structural entries' rules may
    read the structural facts (embedding, head, name): the others are built from bare tensors.
    """

    name: str
    factory: Callable[..., Any]
    library: str  # the import name checked for availability
    default_lr: float
    lr_range: tuple[float, float]
    precision: str
    rule: Callable[..., ParamState]
    hf_alias: str = ""  # HF Trainer's `optim` name for exactly this optimizer ("" where HF has none)
    aliases: tuple[str, ...] = ()  # other spellings
    extra: str = ""  # `pip install "optbench[extra]"`; "" when a core dependency brings the library
    description: str = ""
    default_kwargs: dict[str, Any] = field(default_factory=dict)
    structural: bool = False
    needs_cuda: str = ""  # why it cannot run without CUDA ("" when it can)
    broken: str = ""  # why it cannot run here at all, found by running it ("" when it can)
    missing_reason: str = ""  # why the library is missing when no extra brings it (XLA, NPU, not on PyPI)
    # Why the update runs inside backward (per-parameter hooks: layer-wise GaLore/APOLLO, LOMO); "" when
    # optimizer.step() does it. Such an entry has no step to time apart and cannot wait for the ranks' gradients.
    step_in_backward: str = ""
    # The `optim` Trainer must be told so that its training step drives this optimizer (LOMO's fused backward,
    # which takes the learning rate): such an entry trains only under the trainer engine.
    trainer_optim: str = ""
    # How it treats FSDP2's sharded (DTensor) parameters: "local" (state by the rule applied to each rank's local
    # shard), why it cannot step them, or "" when not known (optbench.memory.sharding predicts from this).
    fsdp2: str = ""
    paging: Callable[[Any], tuple[bool | None, str | None]] = _no_paging
    before_eval: Callable[[Any], None] = _no_hook
    after_eval: Callable[[Any], None] = _no_hook
    shared: Callable[..., ParamState | None] = no_shared

    def unavailable_reason(self) -> str | None:
        """None when the entry can be built here, else why not."""
        if importlib.util.find_spec(self.library) is None:
            if self.missing_reason:
                return self.missing_reason
            return f"needs `pip install \"optbench[{self.extra}]\"`" if self.extra else f"needs {self.library}"
        if self.needs_cuda:
            import torch

            if not torch.cuda.is_available():
                return self.needs_cuda
        return self.broken or None

    @property
    def available(self) -> bool:
        return self.unavailable_reason() is None

    def runs_under(self, engine: str, parallel: str = "none", fidelity: bool = False) -> str | None:
        """None when a trial with this engine and parallel mode can train the entry, else why not (one line)."""
        if self.trainer_optim and (engine != "trainer" or parallel != "none"):
            return (f"{self.name} updates the weights inside Trainer's backward ({self.step_in_backward}): "
                    "run it with --engine trainer, single-process")
        if self.step_in_backward and parallel != "none":
            return (f"{self.name} steps each parameter inside backward ({self.step_in_backward}), before the ranks "
                    "average their gradients: single-process only")
        if self.step_in_backward and fidelity:
            return f"{self.name} has no optimizer.step() apart from backward for --fidelity to compare"
        return None

    @property
    def names(self) -> tuple[str, ...]:
        """Every name `resolve` accepts for this entry."""
        return tuple(dict.fromkeys(n for n in (self.name, self.hf_alias, *self.aliases) if n))

    def settings(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {**self.default_kwargs, **kwargs}

    def build(self, params: Iterable[Any], lr: float | None = None, **kwargs: Any) -> Any:
        """Build from a bare parameter list (structural entries fall back to their shapes-only rule)."""
        lr = self.default_lr if lr is None else lr
        if self.structural:
            return self.factory(describe_tensors(params), lr=lr, **self.settings(kwargs))
        return self.factory(params, lr=lr, **self.settings(kwargs))

    def build_for(self, model: Any, lr: float | None = None, **kwargs: Any) -> Any:
        """Build for a model's trainable parameters, using its structure where the entry needs it."""
        lr = self.default_lr if lr is None else lr
        if self.structural:
            return self.factory(describe_model(model), lr=lr, **self.settings(kwargs))
        return self.factory([p for p in model.parameters() if p.requires_grad], lr=lr, **self.settings(kwargs))

    def state_map(self, params: Sequence[Param], **settings: Any) -> StateMap:
        """The rule applied to each parameter, and the shared row; `settings` as the factory gets them."""
        states = [self.rule(p, **settings) for p in params]
        return StateMap(params=list(zip(params, states, strict=True)), shared=self.shared(states, **settings))

    def count(self, params: Sequence[Param], **settings: Any) -> Count:
        """The analytic count: the sum over `state_map`."""
        return self.state_map(params, **settings).count

    def model_facts(self, model: Any) -> list[Param]:
        """Facts for each trainable parameter of `model`, names included; structural flags only for structural
        entries, whose build sees the structure (the others are built from bare tensors)."""
        facts = [facts for facts, _ in describe_model(model)]
        bare = dict(embedding=False, head=False, linear=None, layer_norm=False)
        return facts if self.structural else [replace(p, **bare) for p in facts]

    def analytic_map_for(self, model: Any, **kwargs: Any) -> StateMap:
        """The state map for `model` as `build_for(model, **kwargs)` would optimise it."""
        return self.state_map(self.model_facts(model), **self.settings(kwargs))

    def analytic_state_bytes(self, shapes: list[Shape]) -> int:
        """State bytes for fp32 parameters of these shapes, structure unknown (estimate, scaling)."""
        return self.count([Param.from_shape(s) for s in shapes], **self.default_kwargs).state_bytes

    def analytic_for(self, model: Any, **kwargs: Any) -> AnalyticState:
        """The analytic facts for `model` as `build_for(model, **kwargs)` would optimise it."""
        params = self.model_facts(model)
        counted = self.state_map(params, **self.settings(kwargs)).count
        weights_bytes = sum(p.nbytes for p in params)
        return AnalyticState(
            state_bytes=counted.state_bytes,
            fp32_state_numel=counted.fp32_state_numel,
            step_traffic_bytes=3 * weights_bytes + 2 * counted.state_bytes,
            trainable_numel=sum(p.numel for p in params),
        )

    @property
    def nominal_bytes_per_param(self) -> float:
        """State bytes per parameter of one 1024 x 1024 fp32 matrix: the figure to quote for big models."""
        return self.analytic_state_bytes([NOMINAL_SHAPE]) / math.prod(NOMINAL_SHAPE)

    def lr_grid(self, points: int) -> list[float]:
        """`points` log-spaced learning rates inside `lr_range`, the default among them."""
        return lr_grid(*self.lr_range, self.default_lr, points)
