"""`optbench fit --memory SIZE`: what a memory saving buys — each optimizer's largest batch (or sequence) in a budget.

Comparing optimizers at one batch size hides what their memory savings are for: a bigger batch or a longer
sequence in the same memory. For each optimizer the peak predictor (optbench/memory/predict.py) proposes the
largest size on a grid whose predicted peak fits the budget; short measured trials then confirm it: that
size must measure within the budget and the next size on the grid must measure over it (or fail `oom`
under the trial's memory cap). Where a measurement disagrees with the prediction, the search moves along
the grid with the prediction rescaled by the last measured / predicted ratio, so a miss costs a trial or
two, not a sweep. The result is a table (largest size, the confirming trials, samples/s at the largest
size) and a figure, "what the memory saving buys".

The budget is for the figure the report calls peak memory: on CPU weights + peak RSS growth (the
process's libraries, ~0.5 GiB of torch and friends, come on top), on CUDA the allocator's peak. The
search itself (`grow`) is a pure function of a predictor and a trial runner.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from optbench.job.devices import device_kind
from optbench.job.spec import PRESETS, TrialSpec
from optbench.memory.calibrate import measured_peak
from optbench.records.record import GIB, MIB, Record, read_records

GROW_FIELDS = {"batch": "batch_size", "seq": "seq_len"}
PROBE_STEPS, PROBE_WARMUP_STEPS = 5, 2  # the peak is reached by the second step; three timed steps for samples/s
PROBE_EVAL_SIZE = 64  # the final evaluation runs after the memory window: keep it short
# RLIMIT_AS cap on CPU probes: 2 x budget + 1 GiB. Address space outgrows resident memory (64 MiB arenas per
# thread, the model and data built after the cap is set), so a tighter cap fails trials that fit.
CPU_CAP_FACTOR, CPU_CAP_SLACK_BYTES = 2.0, GIB
MAX_PROBES = 6


@dataclass(frozen=True)
class Probe:
    """One measured confirming trial."""

    size: int
    status: str  # the record's status: ok | oom | error | timeout | ...
    peak_bytes: int | None  # the predictor's target figure, measured (None unless ok)
    samples_per_s: float | None = None
    trial_id: str = ""

    def fits(self, budget_bytes: int) -> bool:
        return self.status == "ok" and self.peak_bytes is not None and self.peak_bytes <= budget_bytes

    def describe(self, budget_bytes: int) -> str:
        if self.status != "ok" or self.peak_bytes is None:
            return f"{self.size}: {self.status}"
        verdict = "fits" if self.fits(budget_bytes) else "over"
        return f"{self.size}: {self.peak_bytes / GIB:.2f} GiB {verdict}"


@dataclass(frozen=True)
class Growth:
    """The search's answer for one optimizer: the largest measured-fitting size and how sure it is."""

    size: int | None  # largest size measured within the budget (None: none did)
    predicted_size: int | None  # largest size the predictor alone said fits (None: none)
    confirmed: bool  # the next size on the grid measured over the budget (or the grid's first size did)
    probes: tuple[Probe, ...]
    reason: str

    def probe_at(self, size: int | None) -> Probe | None:
        return next((p for p in self.probes if p.size == size), None)


def _last_fitting(predicted: Sequence[float], budget_bytes: int, scale: float) -> int:
    """Index of the largest size whose (rescaled) prediction fits; -1 when none does."""
    fitting = [i for i, value in enumerate(predicted) if value * scale <= budget_bytes]
    return fitting[-1] if fitting else -1


def _next_guess(sizes: Sequence[int], predicted: Sequence[float], probes: Sequence[Probe], budget_bytes: int) -> int:
    """Index of the largest size the measurements so far say fits. With two measured peaks, the line through
    the two nearest the budget (a peak grows about linearly with the batch; the seq² part bends it for
    sequences, which the bracket then absorbs); with one, the prediction times its measured / predicted."""
    ok = [(p.size, float(p.peak_bytes)) for p in probes if p.status == "ok" and p.peak_bytes]
    if len(ok) >= 2:
        (s1, m1), (s2, m2) = sorted(ok, key=lambda point: abs(point[1] - budget_bytes))[:2]
        if s1 != s2 and (m2 - m1) / (s2 - s1) > 0:
            slope = (m2 - m1) / (s2 - s1)
            return _last_fitting([m1 + slope * (size - s1) for size in sizes], budget_bytes, 1.0)
    if ok:
        size, peak = ok[-1]
        return _last_fitting(predicted, budget_bytes, peak / predicted[list(sizes).index(size)])
    return _last_fitting(predicted, budget_bytes, 1.0)


def grow(candidates: Sequence[int], predict: Callable[[int], float], measure: Callable[[int], Probe],
         budget_bytes: int, max_probes: int = MAX_PROBES) -> Growth:
    """The largest of `candidates` that fits `budget_bytes`: predicted, then bracketed by measurements.

    Starts at the largest size whose prediction fits (the smallest size when none does) and measures until
    a size measured within the budget sits right below one measured over it on the grid, each next size
    chosen inside the bracket by `_next_guess`. A trial that fails for another reason than memory counts
    as not fitting (the probes show its status).
    """
    sizes = sorted(set(candidates))
    predicted = [float(predict(size)) for size in sizes]
    start = _last_fitting(predicted, budget_bytes, 1.0)
    fit_at, over_at, index = -1, len(sizes), max(start, 0)
    probes: list[Probe] = []
    while len(probes) < max_probes:
        probes.append(measure(sizes[index]))
        if probes[-1].fits(budget_bytes):
            fit_at = max(fit_at, index)
        else:
            over_at = min(over_at, index)
        if over_at == fit_at + 1 or fit_at == len(sizes) - 1:
            break
        index = min(max(_next_guess(sizes, predicted, probes, budget_bytes), fit_at + 1), over_at - 1)
    size = sizes[fit_at] if fit_at >= 0 else None
    confirmed = over_at == fit_at + 1 and over_at < len(sizes)
    if confirmed:
        reason = "nothing fits: the smallest size is over" if size is None else "the next size measured over"
    elif fit_at == len(sizes) - 1:
        reason = f"the grid's largest size ({sizes[-1]}) fits; larger sizes were not tried"
    else:
        reason = f"not bracketed after {max_probes} trials"
    return Growth(size=size, predicted_size=sizes[start] if start >= 0 else None, confirmed=confirmed,
                  probes=tuple(probes), reason=reason)


def candidate_sizes(grow_by: str, limit: int) -> list[int]:
    """The grid: batch sizes 1, 2, 4, then multiples of 8 (what GPU kernels like); sequence lengths in
    multiples of 16. Up to `limit` (the model's learned positions for sequences)."""
    grid = [1, 2, 4, *range(8, limit + 1, 8)] if grow_by == "batch" else list(range(16, limit + 1, 16))
    return [size for size in grid if size <= limit]


# -- running it: probes as real trials ---------------------------------------------------------------------
def default_job() -> TrialSpec:
    """The default MiniLM job (the `default` preset's workload, batch size and sequence length) on CPU."""
    preset = PRESETS["default"]
    return TrialSpec(optimizer="adamw", workload=preset.workload, device="cpu", batch_size=preset.batch_size,
                     seq_len=preset.seq_len, eval_size=PROBE_EVAL_SIZE, timeout_s=preset.timeout_s)


def probe_spec(job: TrialSpec, optimizer: str, grow_by: str, size: int, budget_bytes: int) -> TrialSpec:
    """A short trial of `job` at `size`. Its memory cap: on CUDA the budget itself (the allocator's limit, so
    a size over it fails `oom`); on CPU a guard against a runaway trial only (`CPU_CAP_FACTOR`), because the
    address space RLIMIT_AS caps grows faster than the resident memory the budget is about."""
    on_cuda = device_kind(job.device) == "cuda"
    cap = budget_bytes if on_cuda else int(CPU_CAP_FACTOR * budget_bytes + CPU_CAP_SLACK_BYTES)
    return dataclasses.replace(job, optimizer=optimizer, steps=PROBE_STEPS, warmup_steps=PROBE_WARMUP_STEPS,
                               eval_size=min(job.eval_size, PROBE_EVAL_SIZE), eval_every=0, max_memory_bytes=cap,
                               **{GROW_FIELDS[grow_by]: size})


def run_probe(spec: TrialSpec, out_path: Path, progress: TextIO | None, sweep: Callable[..., list[Record]]
              ) -> Record:
    """Run one probe through `sweep` (the process layer's run_sweep: a fresh process, appended to `out_path`; a
    probe already recorded ok there is read back instead of rerun). The caller hands the sweep in, so this
    module stays below the process layer."""
    records = sweep([spec], out_path, progress=progress)
    if records:
        return records[0]
    return next(r for r in reversed(read_records(out_path)) if r.trial_id == spec.trial_id and r.status == "ok")


@dataclass(frozen=True)
class FitResult:
    budget_bytes: int
    grow_by: str  # batch | seq
    job: TrialSpec
    device_kind: str
    growths: dict[str, Growth]


def size_limit(facts: Any, grow_by: str, max_size: int | None) -> int:
    """The grid's top: `max_size`, else 1024 samples, or for sequences the model's learned positions (4096
    for a model without a position table)."""
    if max_size:
        return max_size
    if grow_by == "batch":
        return 1024
    tables = [p.shape[0] for p in facts.params if p.name.endswith("position_embeddings.weight")]
    return min(tables) if tables else 4096


def fit(budget_bytes: int, optimizers: Sequence[str], out_path: Path, job: TrialSpec | None = None,
        grow_by: str = "batch", optimizer_kwargs: dict[str, dict[str, Any]] | None = None,
        max_size: int | None = None, progress: TextIO | None = sys.stderr, *,
        run: Callable[[TrialSpec, Path, TextIO | None], Record]) -> FitResult:
    """For each optimizer, the largest size of `job` (default: the MiniLM default job) within `budget_bytes`,
    predicted and confirmed by short trials appended to `out_path` (resumable)."""
    from optbench.memory import predict
    from optbench.optimizers import resolve

    job = job or default_job()
    kind = device_kind(job.device)
    facts = predict.facts_for_spec(job)
    sizes = candidate_sizes(grow_by, size_limit(facts, grow_by, max_size))
    growths = {}
    for name in optimizers:
        entry = resolve(name)
        kwargs = (optimizer_kwargs or {}).get(entry.name, {})

        def predicted(size: int, entry=entry, kwargs=kwargs) -> float:
            shape = {"batch_size": job.batch_size, "seq_len": job.seq_len, GROW_FIELDS[grow_by]: size}
            return predict.predict_peak(facts, entry, kwargs, precision=job.precision, device_kind=kind,
                                        **shape).total_bytes

        def measured(size: int, entry=entry, kwargs=kwargs) -> Probe:
            spec = dataclasses.replace(probe_spec(job, entry.name, grow_by, size, budget_bytes),
                                       optimizer_kwargs=kwargs)
            record = run(spec, out_path, progress)
            peak = measured_peak(record) if record.status == "ok" else None
            return Probe(size, record.status, peak, record.samples_per_s, record.trial_id)

        growths[entry.name] = grow(sizes, predicted, measured, budget_bytes)
        if progress is not None:
            print(f"optbench fit: {entry.name}: {_summary(growths[entry.name], budget_bytes)}", file=progress,
                  flush=True)
    return FitResult(budget_bytes, grow_by, job, kind, growths)


def _summary(growth: Growth, budget_bytes: int) -> str:
    trials = "; ".join(p.describe(budget_bytes) for p in growth.probes)
    return f"largest {growth.size} (predicted {growth.predicted_size}; {growth.reason}) [{trials}]"


# -- what it says: the table and the figure ---------------------------------------------------------------
def fit_table(result: FitResult) -> Any:
    """One row per optimizer: the largest size, what the predictor said, the confirming trials, the measured
    peak and samples/s at the largest size (a pandas DataFrame)."""
    import pandas as pd

    unit = "batch" if result.grow_by == "batch" else "seq"
    rows = []
    for name, growth in result.growths.items():
        at = growth.probe_at(growth.size)
        rows.append({"optimizer": name, f"largest {unit}": growth.size, f"predicted {unit}": growth.predicted_size,
                     "confirmed": growth.confirmed,
                     "peak MiB": None if at is None or at.peak_bytes is None else at.peak_bytes / MIB,
                     "samples/s": None if at is None else at.samples_per_s,
                     "trials": "; ".join(p.describe(result.budget_bytes) for p in growth.probes),
                     "why": growth.reason})
    return pd.DataFrame(rows).astype({f"largest {unit}": "Int64", f"predicted {unit}": "Int64"})


def _job_label(result: FitResult) -> str:
    job = result.job
    fixed = f"seq {job.seq_len}" if result.grow_by == "batch" else f"batch {job.batch_size}"
    return f"{job.model or job.workload}, {fixed}, {job.precision}, {result.device_kind}"


def render(result: FitResult) -> str:
    """The table as markdown under a header saying what the budget covers and how sizes were confirmed."""
    header = [f"largest {result.grow_by} within {result.budget_bytes / GIB:.2f} GiB per optimizer: "
              f"{_job_label(result)}",
              "peak = " + ("weights + peak RSS growth (the process's libraries come on top)"
                           if result.device_kind == "cpu" else "the CUDA allocator's peak"),
              f"predicted by optbench.memory.predict, confirmed by {PROBE_STEPS}-step trials: the largest size must "
              "measure within the budget and the next size on the grid over it (or fail oom)"]
    table = fit_table(result).to_markdown(index=False, floatfmt=".1f")
    return "\n".join(header) + "\n\n" + table + "\n"


def plot(result: FitResult, path: Path) -> Path:
    """"What the memory saving buys": largest size and samples/s at it, per optimizer, side by side.
    Unconfirmed sizes are hatched. Matplotlib's object API on the Agg canvas (headless, no global state)."""
    import pandas as pd
    from matplotlib.figure import Figure

    from optbench.report.plots import optimizer_colour

    table = fit_table(result)
    unit = "batch" if result.grow_by == "batch" else "seq"
    names = list(table["optimizer"])
    colours = [optimizer_colour(n) for n in names]
    fig = Figure(figsize=(11, 4.4), dpi=130, layout="constrained")
    left, right = fig.subplots(1, 2)
    for ax, column, label in ((left, f"largest {unit}", f"largest {unit} size"),
                              (right, "samples/s", "samples/s at that size")):
        values = [0.0 if pd.isna(v) else float(v) for v in table[column]]  # nothing fitted: an empty bar
        bars = ax.bar(names, values, color=colours)
        for bar, confirmed in zip(bars, table["confirmed"], strict=True):
            bar.set_hatch("" if confirmed else "//")
        ax.bar_label(bars, labels=[f"{v:.0f}" if column != "samples/s" else f"{v:.1f}" for v in values])
        ax.set_ylabel(label)
        ax.tick_params(axis="x", labelrotation=20)
    fig.suptitle(f"What the memory saving buys: {_job_label(result)}, budget {result.budget_bytes / GIB:.2f} GiB"
                 " (hatched: not confirmed)", fontsize=11)
    fig.savefig(path)
    return path


def save(result: FitResult, out_path: Path) -> tuple[Path, Path]:
    """The table (markdown) and the figure beside the probes' results file: OUT.md and OUT.png."""
    table = out_path.with_suffix(".md")
    table.write_text(render(result))
    return table, plot(result, out_path.with_suffix(".png"))
