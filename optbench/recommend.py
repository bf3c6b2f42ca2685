"""Which optimizer, for this model and this memory budget? Fit first, then the memory–accuracy trade-off.

Memory per optimizer is estimate.py's weights + grads + state (analytic from the model's shapes, or
measured per parameter from results) plus, when results are given, the activation overhead measured
in them (`other_peak_bytes`: peak minus weights, grads and state). Accuracy comes only from results.
Among the optimizers that fit, the ones on the Pareto front (no other fitting optimizer needs less
memory *and* scores at least as well) come first; then the rest that fit; then what does not fit.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from optbench import estimate as est
from optbench.optimizers import REGISTRY, UnknownOptimizerError, resolve


@dataclass(frozen=True)
class Recommendation:
    estimate: est.Estimate
    activation_bytes: int | None  # measured overhead on top of weights + grads + state; None: not known
    accuracy: float | None  # mean eval accuracy of the ok records; None: not measured
    fits: bool
    pareto: bool
    unavailable: str | None  # why this optimizer cannot run here (a missing library), else None

    @property
    def total_bytes(self) -> int:
        return self.estimate.per_gpu_bytes() + (self.activation_bytes or 0)


def _per_optimizer(records: Sequence, field: str) -> dict[str, float]:
    """Mean of `field` over the ok records, per registry name (aliases folded in)."""
    values: dict[str, list[float]] = {}
    for record in records:
        value = getattr(record, field, None)
        if record.status != "ok" or value is None:
            continue
        try:
            name = resolve(record.optimizer).name
        except UnknownOptimizerError:
            continue
        values.setdefault(name, []).append(float(value))
    return {name: statistics.fmean(v) for name, v in values.items()}


def recommend(size: est.ModelSize, budget_bytes: int, records: Sequence = (),
              precision: str = "fp32") -> list[Recommendation]:
    """Every registered optimizer, Pareto front of those that fit first, then other fits, then misfits."""
    measured_state = est.measured_bytes_per_param(records) if records else None
    activations = _per_optimizer(records, "other_peak_bytes")
    accuracies = _per_optimizer(records, "eval_accuracy")
    # An optimizer the results lack gets the largest overhead they measured: a fit should not be a guess.
    fallback_activation = max(activations.values()) if activations else None
    rows = []
    for estimate in est.estimate(size, measured_state, precision):
        activation = activations.get(estimate.optimizer, fallback_activation)
        rows.append(Recommendation(
            estimate=estimate,
            activation_bytes=None if activation is None else round(activation),
            accuracy=accuracies.get(estimate.optimizer), fits=False, pareto=False,
            unavailable=REGISTRY[estimate.optimizer].unavailable_reason()))
    rows = [dataclasses.replace(r, fits=r.total_bytes <= budget_bytes) for r in rows]
    scored = [r for r in rows if r.fits and r.accuracy is not None]
    rows = [dataclasses.replace(r, pareto=r in scored and _dominator(r, scored) is None) for r in rows]
    return sorted(rows, key=lambda r: (not r.fits, not r.pareto, r.total_bytes))


def _dominator(row: Recommendation, others: Sequence[Recommendation]) -> Recommendation | None:
    """An optimizer needing no more memory and scoring no worse, strictly better in one: `row` is dominated."""
    for other in others:
        if other is row:
            continue
        no_worse = other.total_bytes <= row.total_bytes and other.accuracy >= row.accuracy
        if no_worse and (other.total_bytes < row.total_bytes or other.accuracy > row.accuracy):
            return other
    return None


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / est.GIB:.2f} GiB"


def _reason(row: Recommendation, rows: Sequence[Recommendation], budget_bytes: int) -> str:
    e = row.estimate
    parts = f"weights {_gib(e.weights_bytes)} + grads {_gib(e.grads_bytes)} + state {_gib(e.state_bytes)} ({e.basis})"
    if row.activation_bytes is not None:
        parts += f" + activations {_gib(row.activation_bytes)} (measured)"
    accuracy = f"accuracy {row.accuracy:.3f}" if row.accuracy is not None else "accuracy not measured"
    if not row.fits:
        verdict = f"does not fit: {_gib(row.total_bytes - budget_bytes)} over the budget"
    elif row.pareto:
        verdict = "Pareto front: nothing that fits needs less memory and scores at least as well"
    elif row.accuracy is None:
        verdict = "fits; no results to weigh its accuracy"
    else:
        better = _dominator(row, [r for r in rows if r.fits and r.accuracy is not None])
        verdict = f"fits, but {better.estimate.optimizer} needs no more memory and scores at least as well"
    note = f" [unavailable here: {row.unavailable}]" if row.unavailable else ""
    return f"{e.optimizer:<22} {_gib(row.total_bytes):>11} = {parts}; {accuracy}; {verdict}{note}"


def render(rows: Sequence[Recommendation], size: est.ModelSize, budget_bytes: int, precision: str,
           results_name: str | None) -> str:
    """A header (what was counted), the answer, then one line of reasoning per optimizer."""
    header = [f"{size.num_params:,} trainable parameters ({size.source}), {precision} training, "
              f"budget {_gib(budget_bytes)} per GPU"]
    if results_name:
        header.append(f"activations and accuracy measured in {results_name} (valid for that job's batch and "
                      "sequence length)")
    else:
        header.append("no --results: activations, temporaries and the CUDA context come on top; accuracy unknown")
    fitting = [r for r in rows if r.fits]
    if fitting:
        best = [r.estimate.optimizer for r in fitting if r.pareto] or [fitting[0].estimate.optimizer]
        answer = f"fits: {len(fitting)} of {len(rows)} optimizers; start with {', '.join(best)}"
    else:
        smallest = min(rows, key=lambda r: r.total_bytes)
        answer = (f"nothing fits in {_gib(budget_bytes)}: the smallest, {smallest.estimate.optimizer}, needs "
                  f"{_gib(smallest.total_bytes)}; try --precision bf16, a smaller batch, ZeRO-1 over several GPUs "
                  "(`optbench estimate --gpus N`) or a smaller model")
    lines = [_reason(r, rows, budget_bytes) for r in rows]
    return "\n".join(header) + "\n\n" + answer + "\n\n" + "\n".join(lines)
