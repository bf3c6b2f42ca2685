"""`optbench fit --memory SIZE`: what a memory saving buys — each optimizer's largest batch (or sequence) in a budget.

Comparing optimizers at one batch size hides what their memory savings are for: a bigger batch or a longer
sequence in the same memory. For each optimizer the peak predictor (optbench/memory/predict.py) proposes the
largest size on a grid whose predicted peak fits the budget; short measured trials then confirm it. Each size is
measured `repeats` times, each in a fresh process (seeds 0, 1, ...: the same shapes), because a peak moves between
runs of one build (CPU RSS by pages and malloc arenas, ±16-19 MiB here): a size *fits* only when its largest peak is
under the budget by at least the spread its repeats showed, is *over* when its smallest peak is over the budget (or
a trial failed `oom` under its memory cap), and is *too close to call* between the two, which counts as not fitting.
The answer is the largest size that fits with the next size on the grid over or too close. Where a measurement
disagrees with the prediction, the search moves along the grid with the prediction rescaled by the last measured /
predicted ratio, so a miss costs a size or two, not a sweep. The result is a table (largest size, the confirming
trials, samples/s at the largest size) and a figure, "what the memory saving buys"; `result_from_records` rebuilds
the same table from the trials' records alone.

The budget is for the figure the report calls peak memory: on CPU weights + peak RSS growth over the process's
baseline after setup (the process's own libraries, ~0.5 GiB of torch and friends, and the data come on top: the
table shows the process's whole peak RSS beside it, which the budget does not cover), on CUDA the allocator's peak.
The search itself (`grow`) is a pure function of a predictor and a trial runner.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from optbench.job.devices import device_kind
from optbench.job.spec import PRESETS, TrialSpec
from optbench.memory.calibrate import measured_peak
from optbench.records.record import GIB, MIB, Record, read_records
from optbench.records.text import size_text

GROW_FIELDS = {"batch": "batch_size", "seq": "seq_len"}
PROBE_STEPS, PROBE_WARMUP_STEPS = 5, 2  # the peak is reached by the second step; three timed steps for samples/s
PROBE_EVAL_SIZE = 64  # the final evaluation runs after the memory window: keep it short
# RLIMIT_AS cap on CPU probes: 2 x budget + 1 GiB. Address space outgrows resident memory (64 MiB arenas per
# thread, the model and data built after the cap is set), so a tighter cap fails trials that fit.
CPU_CAP_FACTOR, CPU_CAP_SLACK_BYTES = 2.0, GIB
MAX_PROBES = 6  # sizes tried per optimizer before the search gives up bracketing
REPEATS = 3  # trials per size: the spread of three peaks is the run-to-run jitter a size must clear


@dataclass(frozen=True)
class Probe:
    """One size, measured: the repeats' peaks (the predictor's target figure), their spread, and how the size
    stands against a budget."""

    size: int
    status: str  # ok when every repeat was ok, else the first failure's status: oom | error | timeout | ...
    peak_bytes: int | None  # the largest repeat's peak (None unless ok)
    samples_per_s: float | None = None
    trial_id: str = ""
    jitter_bytes: int = 0  # largest minus smallest peak over the repeats: the run-to-run jitter measured here
    repeats: int = 1
    process_peak_bytes: int | None = None  # the whole process's peak RSS (CPU), which the budget does not cover
    predicted_bytes: int | None = None  # what the predictor said before the trial ran

    def fits(self, budget_bytes: int) -> bool:
        """Under the budget by at least the jitter the repeats showed: a rerun would fit too."""
        return self.status == "ok" and self.peak_bytes is not None and self.peak_bytes + self.jitter_bytes <= \
            budget_bytes

    def verdict(self, budget_bytes: int) -> str:
        if self.fits(budget_bytes):
            return "fits"
        over = self.status != "ok" or self.peak_bytes is None or self.peak_bytes - self.jitter_bytes > budget_bytes
        return "over" if over else "too close to call"

    def describe(self, budget_bytes: int) -> str:
        if self.status != "ok" or self.peak_bytes is None:
            return f"{self.size}: {self.status}"
        jitter = f" ±{self.jitter_bytes / MIB:.0f} MiB" if self.repeats > 1 else ""
        return f"{self.size}: {self.peak_bytes / GIB:.2f} GiB{jitter} {self.verdict(budget_bytes)}"


def probe_from_records(size: int, records: Sequence[Record]) -> Probe:
    """One size's probe from its repeats' records (one per seed)."""
    failed = [r for r in records if r.status != "ok"]
    peaks = [int(p) for p in (measured_peak(r) for r in records if r.status == "ok") if p is not None]
    process = [r.peak_rss_bytes for r in records if r.status == "ok" and r.peak_rss_bytes is not None]
    speeds = [r.samples_per_s for r in records if r.samples_per_s]
    ok = not failed and bool(peaks)
    return Probe(size, failed[0].status if failed else ("ok" if peaks else "error"), max(peaks) if ok else None,
                 statistics.median(speeds) if ok and speeds else None, records[0].trial_id if records else "",
                 max(peaks) - min(peaks) if ok else 0, len(records), max(process) if ok and process else None,
                 records[0].predicted_peak_bytes if records else None)


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


def settle(sizes: Sequence[int], probes: Sequence[Probe], budget_bytes: int, max_probes: int | None = None
           ) -> tuple[int | None, bool, str]:
    """(largest size that fits, whether the next grid size measured over or too close, why) from the probes:
    the one reading of a search, live (`grow`) or rebuilt from records (`result_from_records`)."""
    index = {size: i for i, size in enumerate(sizes)}
    fit_at = max((index[p.size] for p in probes if p.fits(budget_bytes)), default=-1)
    over_at = min((index[p.size] for p in probes if not p.fits(budget_bytes)), default=len(sizes))
    size = sizes[fit_at] if fit_at >= 0 else None
    if over_at == fit_at + 1 and over_at < len(sizes):
        return size, True, ("nothing fits: the smallest size is over" if size is None else
                            f"the next size measured {probes_by_size(probes)[sizes[over_at]].verdict(budget_bytes)}")
    if fit_at == len(sizes) - 1:
        return size, False, f"the grid's largest size ({sizes[-1]}) fits; larger sizes were not tried"
    return size, False, f"not bracketed after {max_probes or len(probes)} sizes"


def probes_by_size(probes: Sequence[Probe]) -> dict[int, Probe]:
    return {p.size: p for p in probes}


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
    size, confirmed, reason = settle(sizes, probes, budget_bytes, max_probes)
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


class FitError(ValueError):
    """A search that cannot be run as asked (said before any trial starts)."""


def size_limit(facts: Any, grow_by: str, max_size: int | None) -> int:
    """The grid's top: `max_size`, else 1024 samples, or for sequences the model's learned positions (4096
    for a model without a position table). Sequences past those positions are refused: every trial there would
    end `error` (an index past the table) and the search would spend its probes learning nothing."""
    if grow_by == "batch":
        return max_size or 1024
    positions = facts.positions
    if max_size and positions is not None and max_size > positions:
        raise FitError(f"--max-size {max_size} is more than the {positions} positions {facts.name} has; "
                       f"use --max-size {positions} or less")
    return max_size or positions or 4096


def check_repeats(repeats: int) -> None:
    if repeats < 2:
        raise FitError("fit needs at least two trials per size: one trial cannot show how far a peak moves "
                       "between runs, so it cannot tell a size that fits from one that fits by luck")


def fit(budget_bytes: int, optimizers: Sequence[str], out_path: Path, job: TrialSpec | None = None,
        grow_by: str = "batch", optimizer_kwargs: dict[str, dict[str, Any]] | None = None,
        max_size: int | None = None, progress: TextIO | None = sys.stderr, *,
        run: Callable[[TrialSpec, Path, TextIO | None], Record], repeats: int = REPEATS) -> FitResult:
    """For each optimizer, the largest size of `job` (default: the MiniLM default job) within `budget_bytes`,
    predicted and confirmed by short trials appended to `out_path` (resumable), `repeats` per size."""
    from optbench.memory import predict
    from optbench.optimizers import resolve

    check_repeats(repeats)
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
            return probe_from_records(size, [run(dataclasses.replace(spec, seed=seed), out_path, progress)
                                             for seed in range(repeats)])

        growths[entry.name] = grow(sizes, predicted, measured, budget_bytes)
        if progress is not None:
            print(f"optbench fit: {entry.name}: {_summary(growths[entry.name], budget_bytes)}", file=progress,
                  flush=True)
    return FitResult(budget_bytes, grow_by, job, kind, growths)


def _summary(growth: Growth, budget_bytes: int) -> str:
    trials = "; ".join(p.describe(budget_bytes) for p in growth.probes)
    largest, predicted = (size if size is not None else "none" for size in (growth.size, growth.predicted_size))
    return f"largest {largest} (predicted {predicted}; {growth.reason}) [{trials}]"


def result_from_records(records: Sequence[Record], budget_bytes: int, grow_by: str = "batch") -> FitResult:
    """A fit's answer rebuilt from its trials' records alone (what `fit` appended to its results file), so a
    published table is rendered from records: per optimizer the sizes in the order they were first tried (the
    first is where the prediction started the search), each size's repeats one probe."""
    field_name = GROW_FIELDS[grow_by]
    growths: dict[str, Growth] = {}
    for name in dict.fromkeys(r.optimizer for r in records):
        mine = sorted((r for r in records if r.optimizer == name), key=lambda r: r.started_at)
        by_size: dict[int, list[Record]] = {}
        for record in mine:
            by_size.setdefault(int(getattr(record, field_name)), []).append(record)
        probes = [probe_from_records(size, group) for size, group in by_size.items()]
        sizes = candidate_sizes(grow_by, max(by_size))
        size, confirmed, reason = settle(sizes, probes, budget_bytes)
        first = probes[0]
        predicted = first.size if first.predicted_bytes is not None and first.predicted_bytes <= budget_bytes \
            else None
        growths[name] = Growth(size, predicted, confirmed, tuple(probes), reason)
    first = records[0]
    job = TrialSpec(optimizer=first.optimizer, workload=first.workload, model=first.model, device=first.device,
                    batch_size=first.batch_size, seq_len=first.seq_len, precision=first.precision)
    return FitResult(budget_bytes, grow_by, job, device_kind(first.device), growths)


# -- what it says: the table and the figure ---------------------------------------------------------------
def fit_table(result: FitResult) -> Any:
    """One row per optimizer: the largest size, what the predictor said, the confirming trials, the measured
    peak (largest repeat), its jitter, the process's whole peak and samples/s at the largest size (a DataFrame)."""
    import pandas as pd

    unit = "batch" if result.grow_by == "batch" else "seq"
    rows = []
    for name, growth in result.growths.items():
        at = growth.probe_at(growth.size)
        rows.append({"optimizer": name, f"largest {unit}": growth.size, f"predicted {unit}": growth.predicted_size,
                     "confirmed": growth.confirmed,
                     "peak MiB": None if at is None or at.peak_bytes is None else at.peak_bytes / MIB,
                     "jitter MiB": None if at is None or at.peak_bytes is None or at.repeats < 2
                     else at.jitter_bytes / MIB,
                     "process peak MiB": None if at is None or at.process_peak_bytes is None
                     else at.process_peak_bytes / MIB,
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
    header = [f"largest {result.grow_by} within {size_text(result.budget_bytes)} per optimizer: "
              f"{_job_label(result)}", "budget covers " + (
                  "weights + peak RSS growth over the process's post-setup baseline; the process's whole peak RSS "
                  "(its libraries, the data) comes on top and is shown apart, not budgeted"
                  if result.device_kind == "cpu" else "the CUDA allocator's peak"),
              "predicted by optbench.memory.predict, confirmed by short trials, several per size: a size fits when "
              "its largest peak is under the budget by at least the spread its trials showed; the next size on the "
              "grid must measure over (or too close to call, or fail oom)"]
    frame = fit_table(result)
    table = frame.astype(object).where(frame.notna(), None).to_markdown(index=False, floatfmt=".1f",
                                                                         missingval="none")
    return "\n".join(header) + "\n\n" + table + "\n"


def plot(result: FitResult, path: Path) -> Path:
    """"What the memory saving buys": largest size and samples/s at it, per optimizer, side by side.
    Unconfirmed sizes are hatched. Matplotlib's object API on the Agg canvas (headless, no global state)."""
    import pandas as pd
    from matplotlib.figure import Figure

    from optbench.report.canvas import optimizer_colour
    from optbench.report.png import save_figure

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
    return save_figure(fig, path)


def save(result: FitResult, out_path: Path) -> tuple[Path, Path]:
    """The table (markdown) and the figure beside the probes' results file: OUT.md and OUT.png."""
    table = out_path.with_suffix(".md")
    table.write_text(render(result))
    return table, plot(result, out_path.with_suffix(".png"))
