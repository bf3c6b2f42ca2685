"""Peak memory before training: weights, gradients, optimizer state, activations and the step's temporaries.

`predict_peak` adds up what one trial holds at its peak and says which of two phases sets it:
- the optimizer step: weights + gradients + state + the step's own temporaries, plus on CPU the pages the
  allocator still holds from the activations backward freed (glibc keeps freed blocks under its mmap
  threshold resident: on MiniLM about all of them), plus a fixed overhead;
- forward/backward: weights + state (it persists from the first step on) + the activations saved for
  backward (with the loss head's logits and their fp32 copies), plus the same overhead.

Counted: weights and gradients from the parameter facts (a meta-device model has the shapes, not the
bytes), state from the registry's analytic count, the step's temporaries per optimizer family
(`step_temporaries`). Calibrated from a few measured trials of the same model (optbench/memory/calibrate.py):
activation bytes per token per layer, their seq² attention part, the share of activation pages still
held at the step, the fixed overhead and each optimizer library's own (allocator slack, library buffers).
Calibrations are read per device kind by optbench/memory/calibration.py (the user's own file first, else the
package's), keyed by model name, with the trial ids they came from. A model without one gets the analytic
activation estimate scaled like the calibrated models' (`analytic_activation_coefficients`,
`CalibrationSet.borrowed`), flagged uncalibrated.

Targets: on CPU the record's `peak_memory_bytes` (weights + peak RSS growth over the post-warm-up
baseline), on CUDA `peak_cuda_allocated_bytes`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace
from typing import Any

from optbench.job import devices
from optbench.memory.calibration import Calibration, CalibrationSet, load_calibrations
from optbench.optimizers import FP32_BYTES, OptimizerSpec, Param, describe_model

TARGET_FIELDS = {"cpu": "peak_memory_bytes", "cuda": "peak_cuda_allocated_bytes"}
# Element size of the activations each precision saves for backward: autocast runs matmuls in 16 bits
# (norms and softmax stay fp32, which the calibration absorbs), bf16 weights run everything in bf16.
ACTIVATION_BYTES = {"fp32": 4, "bf16-autocast": 2, "fp16-autocast": 2, "bf16": 2}


@dataclass(frozen=True)
class Architecture:
    """What the activation estimate reads from a transformer's config."""

    layers: int
    hidden_size: int
    intermediate_size: int
    heads: int
    vocab_size: int
    causal_lm: bool  # logits at every position (vocab-wide), not one row per sample
    gated_mlp: bool  # a gate and an up projection (SwiGLU, Llama): four intermediate-size tensors, not two
    hidden_dropout: bool  # dropout keeps a 1-byte mask per dropped element
    attention_dropout: bool
    eager_attention: bool  # attention probabilities materialised whatever the device

    @classmethod
    def from_model(cls, model: Any) -> Architecture | None:
        """Read a transformers model's config; None when it does not look like a transformer."""
        config = getattr(model, "config", None)
        get = functools.partial(_first_attr, config)
        layers, hidden = get("num_hidden_layers", "n_layer", "num_layers"), get("hidden_size", "n_embd", "d_model")
        heads = get("num_attention_heads", "n_head")
        if config is None or not (layers and hidden and heads):
            return None
        names = [name for name, _ in model.named_parameters()]
        causal = type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))
        return cls(layers=int(layers), hidden_size=int(hidden), heads=int(heads),
                   intermediate_size=int(get("intermediate_size", "n_inner", "ffn_dim") or 4 * hidden),
                   vocab_size=int(get("vocab_size") or 0), causal_lm=causal,
                   gated_mlp=any(n.endswith("gate_proj.weight") for n in names),
                   hidden_dropout=bool(get("hidden_dropout_prob", "resid_pdrop", "dropout")),
                   attention_dropout=bool(get("attention_probs_dropout_prob", "attention_dropout", "attn_pdrop")),
                   eager_attention=getattr(config, "_attn_implementation", "eager") == "eager")

    def keeps_attention_probs(self, device_kind: str) -> bool:
        """Whether backward keeps the b·heads·s² probabilities: eager attention always; SDPA with dropout on
        CPU (torch's CPU flash kernel has no dropout, so the math kernel runs); never on CUDA's SDPA kernels."""
        return self.eager_attention or (self.attention_dropout and device_kind == "cpu")


def _first_attr(obj: Any, *names: str) -> Any:
    return next((getattr(obj, n) for n in names if getattr(obj, n, None) is not None), None)


@dataclass(frozen=True)
class ModelFacts:
    """A model as the predictor sees it: its name, trainable-parameter facts and architecture (None: unknown)."""

    name: str
    params: tuple[Param, ...]
    arch: Architecture | None
    frozen_numel: int = 0  # parameters that hold weights but no gradient or state

    @classmethod
    def from_model(cls, model: Any, name: str) -> ModelFacts:
        """From a built model, on the meta device or real: shapes and config only, no tensor is touched."""
        params = tuple(facts for facts, _ in describe_model(model))
        frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
        return cls(name=name, params=params, arch=Architecture.from_model(model), frozen_numel=frozen)

    @property
    def positions(self) -> int | None:
        """The learned position table's length: a longer sequence indexes past it. None: the model has none."""
        tables = [p.shape[0] for p in self.params if p.name.endswith("position_embeddings.weight")]
        return min(tables) if tables else None

    def in_precision(self, precision: str) -> tuple[Param, ...]:
        """Parameter facts with the element size the precision stores weights in (`param_bytes`)."""
        return tuple(replace(p, itemsize=param_bytes(precision)) for p in self.params)


def param_bytes(precision: str) -> int:
    """Bytes per weight (and per gradient): 2 with bf16 weights, else 4 (autocast keeps fp32 masters)."""
    return 2 if precision == "bf16" else FP32_BYTES


def analytic_activation_coefficients(arch: Architecture, precision: str, device_kind: str) -> tuple[float, float]:
    """(bytes per token per layer, bytes per sample·head·seq²·layer) that backward keeps, from the config.

    Per token per layer, in the activation element size e: Korthikanti et al. (2022)'s count for a
    transformer layer generalised to any MLP width i: the attention block keeps its input, Q, K, V, the
    context and the output projection's input (6h), the two norms their inputs (2h), the MLP its input and
    two i-wide tensors (before and after the activation; four with a gated MLP: gate, up, act(gate),
    product); dropout adds a 1-byte mask per dropped element (2h). A causal LM's head adds, per token,
    the logits (e·V) and the loss's fp32 copy and log-softmax (8·V), spread over the layers. Per
    sample·head·s² (when the probabilities are kept, see `Architecture.keeps_attention_probs`): the
    softmax output (e), and with dropout its mask (1) and the dropped probabilities (e).
    """
    e = ACTIVATION_BYTES[precision]
    h, i = arch.hidden_size, arch.intermediate_size
    per_token = e * (8 * h + (4 if arch.gated_mlp else 2) * i) + (2 * h if arch.hidden_dropout else 0)
    if arch.causal_lm:
        per_token += (e + 2 * FP32_BYTES) * arch.vocab_size / arch.layers
    per_s2 = 0.0
    if arch.keeps_attention_probs(device_kind):
        per_s2 = 2 * e + 1 if arch.attention_dropout else e
    return float(per_token), float(per_s2)


def activation_units(arch: Architecture, batch_size: int, seq_len: int) -> tuple[float, float]:
    """(token·layers, sample·head·seq²·layers): what the two activation coefficients multiply."""
    return (float(batch_size * seq_len * arch.layers),
            float(batch_size * arch.heads * seq_len * seq_len * arch.layers))


# -- the optimizer step's temporaries ---------------------------------------------------------------------
# Per registry entry: (CPU rule, CUDA rule). ("largest", k, dtype): k tensors the size of the largest
# parameter at once, in "fp32" (the library computes in fp32) or "param" dtype; ("all", k): k full copies
# of all parameters at once (a foreach kernel's result list); ("none",): updated in place or fused.
_TEMPORARY_RULES: dict[str, tuple[tuple[Any, ...], tuple[Any, ...]]] = {
    # torch AdamW: per-tensor loop on CPU (sqrt(v) and its quotient by the bias correction), foreach on CUDA
    # (one param-sized list for sqrt(v)); `fused` one kernel. The CUDA rule is what the default picks.
    "adamw": (("largest", 2, "param"), ("all", 1)),
    "adamw_fused": (("none",), ("none",)),
    "adamw_schedulefree": (("largest", 2, "param"), ("all", 1)),
    "sgd_momentum": (("none",), ("none",)),  # momentum buffer updated in place (it is state, counted there)
    # Adafactor: grad² + eps and the factored estimate's outer product, then -update: two at a time, fp32.
    "adafactor": (("largest", 2, "fp32"), ("largest", 2, "fp32")),
    "adafactor_momentum": (("largest", 2, "fp32"), ("largest", 2, "fp32")),
    "adafactor_torch": (("largest", 2, "param"), ("all", 1)),
    # bitsandbytes on CPU, per tensor with 8-bit state: both moments dequantised to fp32, the scaled gradient
    # copied, sqrt(v) and its quotient built: five fp32 copies (k8); a tensor on 32-bit state (under 4096
    # elements, or an embedding HF keeps at 32 bits) takes the 32-bit path: gradient copy, sqrt(v) + eps and
    # the quotient (k32). ("bnb", k8, k32, embeddings on 32 bits). On CUDA: fused kernels, nothing extra.
    "adamw8bit": (("bnb", 5, 3, False), ("none",)), "adam8bit": (("bnb", 5, 3, False), ("none",)),
    "paged_adamw8bit": (("bnb", 5, 3, False), ("none",)),
    "adamw8bit_hf": (("bnb", 5, 3, True), ("none",)),
    "lion8bit": (("bnb", 5, 4, False), ("none",)),  # state, gradient, two scaled terms and their sum
    "rmsprop8bit": (("bnb", 3, 3, False), ("none",)),
    "ademamix8bit": (("bnb", 10, 4, False), ("none",)),  # three moments, stacked twice
    "paged_adamw": (("largest", 3, "fp32"), ("none",)),
    "lion": (("largest", 4, "fp32"), ("none",)),
}
_GENERIC_RULE = (("largest", 2, "fp32"), ("largest", 2, "fp32"))


def step_temporaries(entry: OptimizerSpec, params: tuple[Param, ...], settings: dict[str, Any],
                     device_kind: str) -> tuple[int, str]:
    """(bytes, rule) the optimizer step allocates on top of its state, from the entry's family rule.

    A per-tensor loop frees each tensor's temporaries before the next, so only the largest tensor's
    count; a foreach kernel holds one result per parameter at once; a fused kernel holds none. torch's
    `fused=True` / `foreach=` kwargs override the family default. Entries without a rule (torchao,
    GaLore, Muon, ...) get two fp32 copies of the largest tensor: a generic per-tensor loop, flagged.
    """
    if not params:
        return 0, "no parameters"
    rules = _TEMPORARY_RULES.get(entry.name)
    rule = (rules or _GENERIC_RULE)[1 if device_kind == "cuda" else 0]
    if entry.library == "torch" and rule[0] != "none":
        if settings.get("fused"):
            rule = ("none",)
        elif settings.get("foreach") is True:
            rule = ("all", 1)
        elif settings.get("foreach") is False:
            rule = ("largest", 2, "param")
    label = ("" if rules else "generic ") + "/".join(str(part) for part in rule)
    if rule[0] == "none":
        return 0, label
    if rule[0] == "all":
        return rule[1] * sum(p.nbytes for p in params), label
    if rule[0] == "bnb":
        return max(FP32_BYTES * p.numel * (rule[1] if _bnb_8bit(p, rule[3], settings) else rule[2])
                   for p in params), label
    largest = max(params, key=lambda p: p.numel)
    itemsize = FP32_BYTES if rule[2] == "fp32" else largest.itemsize
    return rule[1] * largest.numel * itemsize, label


def _bnb_8bit(p: Param, embeddings_fp32: bool, settings: dict[str, Any]) -> bool:
    """Whether bitsandbytes keeps this tensor's state in 8 bits (the rule its analytic count follows)."""
    from optbench.optimizers.bnb import BNB_MIN_8BIT_NUMEL

    return p.numel >= settings.get("min_8bit_size", BNB_MIN_8BIT_NUMEL) and not (embeddings_fp32 and p.embedding)


# -- the prediction ----------------------------------------------------------------------------------------
class PredictError(ValueError):
    """A model the predictor cannot speak to (no transformer config to estimate activations from)."""


@dataclass(frozen=True)
class Prediction:
    """A predicted peak split into parts that add up to `total_bytes`, for the phase that sets the peak.

    In the forward/backward phase the gradients and the step's temporaries do not exist yet (set to 0 here;
    the few gradients that appear while activations are freed are in the calibrated activation figure);
    in the step phase `activation_bytes` is what the allocator still holds of them (retained share).
    """

    device_kind: str
    target: str  # the record field predicted: peak_memory_bytes (CPU) or peak_cuda_allocated_bytes (CUDA)
    phase: str  # "optimizer step" | "forward/backward"
    weights_bytes: int
    grads_bytes: int
    state_bytes: int
    activation_bytes: int
    temporaries_bytes: int
    overhead_bytes: int
    calibrated: bool
    basis: str  # which calibration (and its trial count), or why none
    temporaries_rule: str

    def parts(self) -> dict[str, int]:
        return {"weights": self.weights_bytes, "gradients": self.grads_bytes, "optimizer state": self.state_bytes,
                "activations": self.activation_bytes, "step temporaries": self.temporaries_bytes,
                "overhead": self.overhead_bytes}

    @property
    def total_bytes(self) -> int:
        return sum(self.parts().values())


@dataclass(frozen=True)
class _Coefficients:
    per_token_layer: float
    per_s2_layer: float
    retained_fraction: float
    overhead_bytes: float
    calibrated: bool
    basis: str


def _coefficients(facts: ModelFacts, library: str, precision: str, device_kind: str,
                  calibration: Calibration | None, borrow_from: CalibrationSet | None) -> _Coefficients:
    """The calibration's figures (rescaled by the analytic ratio when it was measured at another precision),
    or, flagged uncalibrated, the analytic estimate scaled by the device's calibrated models' median
    calibrated / analytic ratios, with their median retained share and overhead (`CalibrationSet.borrowed`)."""
    arch = facts.arch
    assert arch is not None
    analytic = analytic_activation_coefficients(arch, precision, device_kind)
    if calibration is None:
        found = borrow_from if borrow_from is not None else load_calibrations(device_kind)
        token_scale, s2_scale, retained, overhead = found.borrowed(facts.name, library)
        lenders = sorted(set(found.models) - {facts.name})
        scaled = f"scaled like {', '.join(lenders)}" if lenders else f"no calibrated model on {device_kind} to scale by"
        return _Coefficients(analytic[0] * token_scale, analytic[1] * s2_scale, retained, overhead, False,
                             f"uncalibrated: analytic activations for {facts.name} on {device_kind}, {scaled}")
    at_calibration = analytic_activation_coefficients(arch, calibration.precision, device_kind)
    scales = [new / old if old else 1.0 for new, old in zip(analytic, at_calibration, strict=True)]
    basis = f"calibrated on {len(calibration.trial_ids)} {device_kind} trials of {calibration.model}"
    if calibration.precision != precision:
        basis += f" at {calibration.precision}, activations rescaled to {precision}"
    return _Coefficients(calibration.bytes_per_token_layer * scales[0], calibration.bytes_per_s2_layer * scales[1],
                         calibration.retained_fraction, calibration.overhead_for(library), True, basis)


def autocast_weight_copies(params: tuple[Param, ...], precision: str) -> int:
    """Autocast casts each matmul weight (2-D, not an embedding lookup) to 16 bits in the forward pass and
    autograd keeps the copy for backward: 2 bytes per element until backward frees it."""
    if not precision.endswith("-autocast"):
        return 0
    return sum(2 * p.numel for p in params if len(p.shape) == 2 and not p.embedding)


def predict_peak(facts: ModelFacts, entry: OptimizerSpec, optimizer_kwargs: dict[str, Any] | None = None, *,
                 batch_size: int, seq_len: int, precision: str = "fp32", device_kind: str = "cpu",
                 calibration: Calibration | None | str = "auto",
                 borrow_from: CalibrationSet | None = None) -> Prediction:
    """The peak of one trial of `facts`' model trained by `entry` (see the module docstring for the phases).

    `calibration="auto"` looks the model up in the device kind's calibrations in use (the user's, else the
    package's); None forces the uncalibrated estimate, which borrows its scales from `borrow_from` (default: those
    same calibrations, other models than this one). Raises PredictError for a model without a known architecture.
    """
    if facts.arch is None:
        raise PredictError(f"{facts.name}: no transformer config (layers, hidden size, heads) to estimate "
                           "activations from; only weights, gradients and state can be counted (optbench estimate)")
    if calibration == "auto":
        calibration = load_calibrations(device_kind).models.get(facts.name)
    params = facts.in_precision(precision)
    settings = entry.settings(optimizer_kwargs or {})
    grads = sum(p.nbytes for p in params)
    weights = grads + facts.frozen_numel * (params[0].itemsize if params else FP32_BYTES)
    state = entry.count(list(params), **settings).state_bytes
    temporaries, rule = step_temporaries(entry, params, settings, device_kind)
    c = _coefficients(facts, entry.library, precision, device_kind, calibration, borrow_from)  # type: ignore
    per_token, per_s2 = activation_units(facts.arch, batch_size, seq_len)
    activations = c.per_token_layer * per_token + c.per_s2_layer * per_s2 + autocast_weight_copies(params, precision)
    retained = c.retained_fraction * activations
    common = dict(device_kind=device_kind, target=TARGET_FIELDS[device_kind], weights_bytes=weights,
                  state_bytes=state, overhead_bytes=round(c.overhead_bytes), calibrated=c.calibrated,
                  basis=c.basis, temporaries_rule=rule)
    if grads + temporaries + retained >= activations:
        return Prediction(phase="optimizer step", grads_bytes=grads, activation_bytes=round(retained),
                          temporaries_bytes=temporaries, **common)
    return Prediction(phase="forward/backward", grads_bytes=0, activation_bytes=round(activations),
                      temporaries_bytes=0, **common)


# -- facts from a spec (meta device) and from a trial's model ---------------------------------------------
def facts_for_spec(spec: Any) -> ModelFacts:
    """The facts of the model `spec`'s workload builds, from its config on the meta device (no weights)."""
    return _facts_for(spec.workload, spec.model, json.dumps(spec.workload_options, sort_keys=True), spec.dataset,
                      spec.seq_len)


@functools.lru_cache(maxsize=16)
def _facts_for(workload: str, model: str | None, options_json: str, dataset: str | None, seq_len: int) -> ModelFacts:
    from optbench.job.spec import TrialSpec
    from optbench.workloads import get_workload

    spec = TrialSpec(optimizer="adamw", workload=workload, model=model, dataset=dataset, seq_len=seq_len,
                     workload_options=json.loads(options_json))
    kind = get_workload(workload)
    return ModelFacts.from_model(kind.meta_model(spec), kind.model_name(spec))


def for_trial(spec: Any, model: Any, entry: OptimizerSpec, device: str = "cpu") -> int | None:
    """`Record.predicted_peak_bytes` for a trial about to train `model` (built, on its device): cheap, reads
    shapes and the config only, allocates nothing. None where the predictor does not model the job: a
    parallel mode (per-rank shards), `--fidelity` (a shadow AdamW), `--resume-check` (a checkpoint in the
    window), or a model without a transformer config."""
    if spec.parallel != "none" or spec.fidelity or spec.resume_check:
        return None
    from optbench.workloads import get_workload

    facts = ModelFacts.from_model(model, get_workload(spec.workload).model_name(spec))
    if facts.arch is None:
        return None
    return predict_peak(facts, entry, spec.optimizer_kwargs, batch_size=spec.batch_size, seq_len=spec.seq_len,
                        precision=spec.precision, device_kind=devices.device_kind(str(device))).total_bytes
