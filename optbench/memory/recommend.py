"""Which optimizer, for this model and this memory budget? Fit first, then the memory–quality trade-off.

Memory per optimizer is estimate.py's weights + grads + state (analytic from the model's shapes, or
measured per parameter from results) plus, when results are given, the activation overhead measured
in them (`other_peak_bytes`: peak minus weights, grads and state). Quality is the results' target metric
(metrics.eval_target: accuracy for a classifier, perplexity for the `lm` workload, with its direction), and
how it compares with AdamW is said in the verdict words of stats.py (paired over the seeds both ran); an optimizer
whose every seed ended at chance has no quality figure (report/bounds.py's `untrained`), and is not ranked on it.
Among the optimizers that fit, the ones on the Pareto front (pareto.pareto_front: no other fitting optimizer
needs less memory *and* scores at least as well) come first; then the rest that fit; then what does not fit.

From results, only one job's final trials count, as the report reads them (report/frame.py): a study's lr walk
tries lrs it then rejects, and those trials say nothing about the optimizer at its chosen lr. A results file
holding several jobs gives its measurements from the job with the most ok finals; the header names it.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from optbench.memory import estimate as est
from optbench.optimizers import REGISTRY, UnknownOptimizerError, resolve
from optbench.records.record import REFERENCE_OPTIMIZER, Record
from optbench.records.text import size_text
from optbench.report import pareto, stats
from optbench.report.cells import untrained_row
from optbench.report.metrics import eval_target


@dataclass(frozen=True)
class Recommendation:
    estimate: est.Estimate
    activation_bytes: int | None  # measured overhead on top of weights + grads + state; None: not known
    quality: float | None  # mean target metric of the ok records over seeds; None: not measured
    fits: bool
    pareto: bool
    unavailable: str | None  # why this optimizer cannot run here (a missing library), else None
    verdict: str | None = None  # against the reference optimizer, in the verdict words
    untrained: bool = False  # every seed ended at chance (report/bounds.py): no quality figure, not weighed
    metric: str = "accuracy"  # the results' target metric
    mode: str = "max"  # its direction: "max" larger is better, "min" smaller
    job: str | None = None  # the results' job the measurements come from (None: no results)
    other_jobs: int = 0  # jobs in the results that were left out
    memory_note: str | None = None  # records of another model or precision whose memory was not used (measured_here)
    ok_finals: int = 0  # that job's final trials that ended ok: none, and nothing was measured at all

    @property
    def total_bytes(self) -> int:
        """The predicted peak with the predictor's safety margin where a batch and sequence length were given;
        else weights + grads + state and the activation overhead measured in the results."""
        if self.estimate.predicted_peak_bytes is not None:
            return self.estimate.safe_bytes()
        return self.estimate.per_gpu_bytes() + (self.activation_bytes or 0)

    def point(self) -> tuple[float, float]:
        """(memory, quality) with larger quality better, for pareto.dominates."""
        return self.total_bytes, (self.quality if self.mode == "max" else -self.quality)  # type: ignore[operator]


@dataclass(frozen=True)
class Quality:
    """The results' target metric: its name, whether larger is better, and per optimizer its per-seed means."""

    metric: str = "accuracy"
    mode: str = "max"
    by_seed: dict[str, dict[int, float]] = dataclasses.field(default_factory=dict)
    untrained: frozenset[str] = frozenset()  # every seed at chance: left out of by_seed (no figure from them)

    def mean(self, name: str) -> float | None:
        seeds = self.by_seed.get(name)
        return statistics.fmean(seeds.values()) if seeds else None


def _per_seed(records: Sequence[Record], value: Callable[[Record], float | None]) -> dict[str, dict[int, float]]:
    """Per registry name (aliases folded in) and seed, the mean of `value` over the ok records."""
    values: dict[str, dict[int, list[float]]] = {}
    for record in records:
        number = value(record) if record.status == "ok" else None
        try:
            name = resolve(record.optimizer).name
        except UnknownOptimizerError:
            continue
        if stats.is_finite(number):
            values.setdefault(name, {}).setdefault(int(record.seed), []).append(float(number))  # type: ignore[arg-type]
    return {name: {seed: statistics.fmean(v) for seed, v in seeds.items()} for name, seeds in values.items()}


@dataclass(frozen=True)
class Finals:
    """The records recommend reads: one job's final trials, its label and how many other jobs were left out."""

    records: list[Record]
    job: str | None = None
    other_jobs: int = 0
    verdicts: dict[str, str] = dataclasses.field(default_factory=dict)  # the report's, per registry name
    untrained: frozenset[str] = frozenset()  # the report's `untrained` rows (report/cells.py), per registry name


def finals_of(records: Sequence[Record]) -> Finals:
    """The final trials (report/frame.py's `final`: a `run`'s trials, a study's final stage and its tune trials at
    the chosen lr) of the job with the most ok finals (ties: the first in the file), with the report's verdict of
    each against the reference: one rule (saturation, an arm that did not train, what one eval row resolves), not a
    second paired test here that said nothing where the report said *worse*), and the optimizers whose row the report
    shows as `untrained` (report/cells.py's `untrained_row`: the same rule, not a per-seed copy of it)."""
    from optbench.report.frame import summarize, trials_frame

    frame = trials_frame(records)
    finals = frame[frame["final"]] if not frame.empty else frame
    if finals.empty:
        return Finals([])
    ok = finals["status"] == "ok"
    counts = ok.groupby(finals["job_id"], sort=False).sum()
    chosen = finals[finals["job_id"] == counts.idxmax()]
    verdicts, untrained = _read_summary(summarize(frame), counts.idxmax())
    return Finals(list(chosen["record"]), str(chosen["job"].iloc[0]), finals["job_id"].nunique() - 1,
                  verdicts, untrained)


def _read_summary(summary, job_id: str) -> tuple[dict[str, str], frozenset[str]]:
    """Of one job's ok summary rows, per registry name: the report's verdict against the reference, and which rows
    the report shows as `untrained`."""
    verdicts, untrained = {}, set()
    for _, row in summary[(summary["job_id"] == job_id) & (summary["status"] == "ok")].iterrows():
        try:
            name = resolve(str(row["optimizer"])).name
        except UnknownOptimizerError:
            continue
        if isinstance(row.get("verdict_vs_adamw"), str):
            verdicts[name] = row["verdict_vs_adamw"]
        if untrained_row(row):
            untrained.add(name)
    return verdicts, frozenset(untrained)


def quality_of(finals: Finals) -> Quality:
    """The target metric per optimizer and seed of one job's final trials (`finals_of`; the first ok one with a
    value names it); an optimizer whose every seed ended at chance (the report's `untrained`) gets no figure, so it
    is neither ranked nor compared: `finals.untrained`, the rows the report shows as `untrained`."""
    records = finals.records
    scored = next((r for r in records if r.status == "ok" and eval_target(r) is not None), None)
    if scored is None:
        return Quality()
    same = [r for r in records if r.target_metric == scored.target_metric]
    by_seed = {name: seeds for name, seeds in _per_seed(same, eval_target).items() if name not in finals.untrained}
    return Quality(scored.target_metric, scored.target_mode, by_seed, finals.untrained)


def recommend(size: est.ModelSize, budget_bytes: int, records: Sequence = (), precision: str = "fp32",
              batch_size: int | None = None, seq_len: int | None = None, device_kind: str = "cuda",
              candidates: Collection[str] | None = None) -> list[Recommendation]:
    """Every registered optimizer (or the `candidates` a user chooses between: the front is theirs), Pareto front
    of those that fit first, then other fits, then misfits. With a
    batch size and sequence length (and a model read from its config) memory is the predicted peak plus the
    predictor's safety margin (optbench.memory.predict), not a sum plus a measured overhead. From `records` only
    one job's final trials count (`finals_of`)."""
    finals = finals_of(records) if records else Finals([])
    memory, note = est.measured_here(finals.records, size, precision)  # quality carries across; memory does not
    measured_state = est.measured_bytes_per_param(memory) if memory else None
    activations = {name: statistics.fmean(seeds.values())
                   for name, seeds in _per_seed(memory, lambda r: r.other_peak_bytes).items()}
    quality = quality_of(finals)
    # An optimizer the results lack gets the largest overhead they measured: a fit should not be a guess.
    fallback_activation = max(activations.values()) if activations else None
    rows = []
    for estimate in est.estimate(size, measured_state, precision, batch_size, seq_len, device_kind):
        if candidates is not None and estimate.optimizer not in candidates:
            continue
        activation = activations.get(estimate.optimizer, fallback_activation)
        rows.append(Recommendation(
            estimate=estimate, activation_bytes=None if activation is None else round(activation),
            quality=quality.mean(estimate.optimizer), fits=False, pareto=False,
            unavailable=REGISTRY[estimate.optimizer].unavailable_reason(),
            verdict=finals.verdicts.get(estimate.optimizer),
            untrained=estimate.optimizer in quality.untrained,
            metric=quality.metric, mode=quality.mode, job=finals.job, other_jobs=finals.other_jobs,
            memory_note=note, ok_finals=sum(r.status == "ok" for r in finals.records)))
    rows = [dataclasses.replace(r, fits=r.total_bytes <= budget_bytes) for r in rows]
    scored = [r for r in rows if r.fits and r.quality is not None]
    front = {id(scored[i]) for i in pareto.pareto_front(*zip(*(r.point() for r in scored), strict=True))} \
        if scored else set()
    rows = [dataclasses.replace(r, pareto=id(r) in front) for r in rows]
    return sorted(rows, key=lambda r: (not r.fits, not r.pareto, r.total_bytes))


def _dominator(row: Recommendation, others: Sequence[Recommendation]) -> Recommendation | None:
    """An optimizer needing no more memory and scoring no worse, strictly better in one: `row` is dominated."""
    return next((o for o in others if o is not row and pareto.dominates(o.point(), row.point())), None)


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / est.GIB:.2f} GiB"


def _reason(row: Recommendation, rows: Sequence[Recommendation], budget_bytes: int) -> str:
    e = row.estimate
    parts = f"weights {_gib(e.weights_bytes)} + grads {_gib(e.grads_bytes)} + state {_gib(e.state_bytes)} ({e.basis})"
    if e.predicted_peak_bytes is not None:
        parts = (f"predicted peak {_gib(e.predicted_peak_bytes)} (of which state {_gib(e.state_bytes)}) "
                 f"+ {e.describe_margin()}")
    elif row.activation_bytes is not None:
        parts += f" + activations {_gib(row.activation_bytes)} (measured)"
    quality = (f"{row.metric} {row.quality:.4g}" if row.quality is not None
               else f"{row.metric} untrained (every seed at chance: no figure)" if row.untrained
               else f"{row.metric} not measured")
    quality += f" ({row.verdict} vs {REFERENCE_OPTIMIZER})" if row.verdict else ""
    if not row.fits:
        verdict = f"does not fit: {_gib(row.total_bytes - budget_bytes)} over the budget"
    elif row.pareto:
        verdict = "Pareto front: nothing that fits needs less memory and scores at least as well"
    elif row.quality is None:
        verdict = f"fits; its {row.metric} did not train here" if row.untrained else \
            f"fits; no results to weigh its {row.metric}"
    else:
        better = _dominator(row, [r for r in rows if r.fits and r.quality is not None])
        verdict = f"fits, but {better.estimate.optimizer} needs no more memory and scores at least as well"
    note = f" [unavailable here: {row.unavailable}]" if row.unavailable else ""
    return f"{e.optimizer:<22} {_gib(row.total_bytes):>11} = {parts}; {quality}; {verdict}{note}"


def _measured_note(rows: Sequence[Recommendation], results_name: str) -> str:
    """Where the measurements come from: the job whose final trials were read, and what was left out."""
    first = rows[0] if rows else None
    if first is None or first.job is None:
        return f"no final trial in {results_name}: activations and quality not measured"
    plural = "s" if first.other_jobs > 1 else ""
    others = f"; {first.other_jobs} other job{plural} in {results_name} left out" if first.other_jobs else ""
    if not first.ok_finals:
        return (f"no final trial of {first.job} in {results_name} ended ok: activations and {first.metric} not "
                f"measured{others}")
    if all(r.activation_bytes is None for r in rows):  # est.measured_here: the results measured another model
        return (f"{first.metric} measured in {results_name}: the final trials of {first.job} (their memory figures "
                f"are another model's or precision's, not used){others}")
    return (f"activations and {first.metric} measured in {results_name}: the final trials of {first.job} (valid "
            f"for that job's batch and sequence length){others}")


def render(rows: Sequence[Recommendation], size: est.ModelSize, budget_bytes: int, precision: str,
           results_name: str | None) -> str:
    """A header (what was counted), the answer, then one line of reasoning per optimizer."""
    header = [f"{size.num_params:,} trainable parameters ({size.source}), {precision} training, "
              f"budget {size_text(budget_bytes)} per GPU"]
    if rows and rows[0].estimate.predicted_peak_bytes is not None:
        header.append(est.band_note(rows[0].estimate))
    if results_name:
        header.append(_measured_note(rows, results_name))
    elif not rows or rows[0].estimate.predicted_peak_bytes is None:
        header.append("no --results: activations, temporaries and the CUDA context come on top; quality unknown")
    fitting = [r for r in rows if r.fits]
    if fitting:
        best = [r.estimate.optimizer for r in fitting if r.pareto] or [fitting[0].estimate.optimizer]
        answer = f"fits: {len(fitting)} of {len(rows)} optimizers; start with {', '.join(best)}"
    else:
        smallest = min(rows, key=lambda r: r.total_bytes)
        answer = (f"nothing fits in {size_text(budget_bytes)}: the smallest, {smallest.estimate.optimizer}, needs "
                  f"{_gib(smallest.total_bytes)}; try --precision bf16, a smaller batch, ZeRO-1 over several GPUs "
                  "(`optbench estimate --gpus N`) or a smaller model")
    lines = [_reason(r, rows, budget_bytes) for r in rows]
    return "\n".join(header) + "\n\n" + answer + "\n\n" + "\n".join(lines)
