"""`study`: a fair comparison in two stages of ordinary trials, all in one results file.

1. Tune: each optimizer over its lr grid and the tune seeds (default seed 0), on the finals' own job (same steps,
   schedule and data), scored on a validation split carved from the *training* rows (`stage="tune"`). The default
   search walks the grid from the registry's default lr (`next_on_walk`): up while the last point is still within
   the noise of the best, then down the same way — on a unimodal curve it finds what the whole grid finds, and
   it skips the far ends a short fine-tune never wins (`--tune-search grid` runs every point, all at once).
2. Final: each optimizer at the lr chosen from the tune records, over the other seeds (`stage="final"`). The tune
   trial at the chosen lr is that seed's final: every study trial is scored on validation (which alone picks the
   lr) and on the eval split (which alone is reported), so the eval split never chooses what it reports on.
   The finals carry the time-to-target threshold, fixed between the stages from the reference optimizer's tune
   scores (`target_from_tuning`), unless `--target` gave one: never set after the fact from the finals' own results.

The lr choice (`stats.choice_from_records`: the best mean validation metric, near-ties within the measured noise
of the validation split and the tune seeds going to the middle of the grid) is always recomputed from the records
in the results file, so killing a study and running the same command again skips every trial already `ok` and
arrives at the same choice.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optbench import optimizers
from optbench.job.spec import StudyBudget, TrialSpec
from optbench.records.record import REFERENCE_OPTIMIZER, Record, read_records
from optbench.report import bounds, stats, tuning
from optbench.report.frame import TARGET_SHARE
from optbench.sweep import Executor, run_sweep
from optbench.sweep.progress import Progress


def lr_grid(name: str, points: int) -> list[float]:
    """The registry's grid for this optimizer: `points` log-spaced lrs inside its lr range, its default among them."""
    return sorted(float(lr) for lr in optimizers.resolve(name).lr_grid(points))


def tune_specs(names: Sequence[str], grids: dict[str, list[float]], settings: dict[str, Any],
               seeds: Sequence[int], kwargs: dict[str, dict[str, Any]] | None = None,
               source: str = tuning.GRID) -> list[TrialSpec]:
    """Every lr of every optimizer over the tune seeds; seed, then lr outermost, so a killed tune stage has
    covered all optimizers."""
    points = max(len(grid) for grid in grids.values())
    return [TrialSpec(optimizer=name, lr=grids[name][i], lr_source=source, seed=seed, stage="tune",
                      optimizer_kwargs=(kwargs or {}).get(name, {}), **settings)
            for seed in seeds for i in range(points) for name in names if i < len(grids[name])]


def _reference(choices: Sequence[stats.LrChoice]) -> stats.LrChoice:
    """The reference optimizer's choice (AdamW), else the first."""
    return next((c for c in choices if c.optimizer == REFERENCE_OPTIMIZER), choices[0])


def target_from_tuning(choices: Sequence[stats.LrChoice]) -> tuple[float | None, str]:
    """The time-to-target threshold, fixed from the tune stage before any final runs: TARGET_SHARE of the reference
    optimizer's best validation score (a "min" metric: best / TARGET_SHARE). Validation rows are not the eval rows
    the curve is scored on, so the target is not read off the curves it then times. None, with why, when there is
    no score, the best is at the validation split's chance (`bounds.untrained`), or the target is at the eval
    split's: 95 % of a score a constant guess makes lies at or below where every curve starts, and the finals
    would be timed to nothing."""
    if not choices:
        return None, "no optimizer was tuned"
    reference = _reference(choices)
    values = [p.value for p in reference.points if p.value is not None]
    if not values:
        return None, f"no tune trial of {reference.optimizer} ended ok with a validation score"
    best = stats.best_value(values, reference.mode)
    if bounds.untrained(best, reference.chance, reference.mode):
        return None, (f"{reference.optimizer}'s best validation {reference.metric} in the tune stage, {best:.4g}, is "
                      f"at chance ({reference.chance:.4g}): the tune stage did not train")
    target = best * TARGET_SHARE if reference.mode == "max" else best / TARGET_SHARE
    if bounds.untrained(target, reference.eval_chance, reference.mode):  # the two splits' chance levels differ
        return None, (f"{TARGET_SHARE:g} x {reference.optimizer}'s best validation {reference.metric}, {target:.4g}, "
                      f"is at chance on the eval split the curves are scored on ({reference.eval_chance:.4g})")
    return target, ""


def final_specs(choices: Sequence[stats.LrChoice], seeds: Sequence[int], settings: dict[str, Any],
                kwargs: dict[str, dict[str, Any]] | None = None) -> list[TrialSpec]:
    """Each optimizer with a chosen lr, once per seed not already tuned (seeds outermost)."""
    return [TrialSpec(optimizer=c.optimizer, lr=c.lr, lr_source=tuning.CHOSEN, seed=seed, stage="final",
                      optimizer_kwargs=(kwargs or {}).get(c.optimizer, {}), **settings)
            for seed in seeds for c in choices if c.lr is not None]


def walk_start(grid: Sequence[float], default: float | None) -> float:
    """Where a walk starts: the registry's default lr where the grid holds it, else the grid's middle point."""
    if default is not None and any(math.isclose(lr, default, rel_tol=1e-9) for lr in grid):
        return default
    return sorted(grid)[(len(grid) - 1) // 2]


def _lr_key(lr: float) -> float:
    """An lr as walks compare them: its log to 9 places (a grid's lrs and the records' agree to float rounding)."""
    return round(math.log(lr), 9)


def tried_points(choice: stats.LrChoice) -> dict[float, stats.LrPoint]:
    """The points of a choice that ran (ok or failed), by `_lr_key`."""
    return {_lr_key(p.lr): p for p in choice.points if p.status != "missing"}


def next_on_walk(grid: Sequence[float], choice: stats.LrChoice, start: float) -> float | None:
    """The next lr a walk tries, None when it is done. The tried points stay one run of the sorted grid: the walk
    goes up while its top point is still in contention (within the near-tie band of the best), then down the same
    way. A failed point (diverged, error) is out of contention; where nothing has worked yet, it goes down, a
    smaller lr being the usual cure, then up."""
    grid = sorted(grid)
    tried = tried_points(choice)
    index = [i for i, lr in enumerate(grid) if _lr_key(lr) in tried]
    if not index:
        return start
    low, high = min(index), max(index)
    usable = [p.value for p in tried.values() if p.value is not None]
    if not usable:
        return grid[low - 1] if low > 0 else grid[high + 1] if high + 1 < len(grid) else None
    best, band = stats.best_value(usable, choice.mode), choice.band or 0.0

    def in_contention(i: int) -> bool:
        value = tried[_lr_key(grid[i])].value
        return value is not None and abs(value - best) <= band + 1e-12

    if high + 1 < len(grid) and in_contention(high):
        return grid[high + 1]
    if low > 0 and in_contention(low):
        return grid[low - 1]
    return None


def extension(grid: Sequence[float], choice: stats.LrChoice) -> float | None:
    """One grid step past the range where the best lr tried sits at its end (report/tuning.py), None otherwise: a
    range whose best point is its end has not bracketed the optimum. A grid of one lr (a user's --lr) is kept."""
    best = tuning.best_point(choice)
    if len(grid) < 2 or best is None:
        return None
    for end, upward in ((max(grid), True), (min(grid), False)):
        if math.isclose(best.lr, end, rel_tol=1e-9):
            return tuning.step_past(grid, upward)
    return None


def extensions(names: Sequence[str], grids: dict[str, list[float]], tune_trials: Sequence[TrialSpec], out: Path,
               settings: dict[str, Any], budget: StudyBudget,
               kwargs: dict[str, dict[str, Any]] | None) -> list[TrialSpec]:
    """Where an optimizer's best lr sits at an end of its grid, one more point past it over the tune seeds (marked
    `extended`). Read from the records, so a rerun extends the same way."""
    specs = []
    for choice in choices_from_file(names, grids, tune_trials, out, settings["steps"]):
        lr = extension(grids[choice.optimizer], choice)
        if lr is not None:
            specs += tune_specs([choice.optimizer], {choice.optimizer: [lr]}, settings, budget.tune_seeds, kwargs,
                                tuning.EXTENDED)
    return specs


def print_line(line: str) -> None:
    """Flushed at once, so progress shows in a log file or CI output while the study runs."""
    print(line, flush=True)


@dataclass
class StudyResult:
    choices: list[stats.LrChoice]
    tune: list[TrialSpec]  # the tune trials run (a walk's, or the whole grid)
    final: list[TrialSpec]


def choices_from_file(names: Sequence[str], grids: dict[str, list[float]], tune_trials: Sequence[TrialSpec], out: Path,
                      steps: int) -> list[stats.LrChoice]:
    """Each optimizer's lr choice from the tune records in `out` (this study's tune trials only)."""
    records = read_records(out) if out.is_file() else []
    ids = {spec.trial_id: spec for spec in tune_trials}
    return [stats.choice_from_records(name, grids[name], [r for r in records if r.trial_id in ids
                                                          and ids[r.trial_id].optimizer == name], steps)
            for name in names]


def walk(names: Sequence[str], grids: dict[str, list[float]], tune_trials: Sequence[TrialSpec], out: Path, steps: int,
         sweep: dict[str, Any]) -> list[TrialSpec]:
    """The tune stage as walks: in each round every optimizer still walking runs its next lr over the tune seeds;
    what comes next is read from the records, so a rerun retraces the same walk, skipping trials already ok.
    Returns the tune trials the walks asked for or found recorded (a killed study's first rounds)."""
    starts = {name: walk_start(grids[name], optimizers.resolve(name).default_lr) for name in names}
    attempted: set[str] = set()
    while True:
        choices = choices_from_file(names, grids, tune_trials, out, steps)
        wanted = {c.optimizer: next_on_walk(grids[c.optimizer], c, starts[c.optimizer]) for c in choices}
        specs = [spec for spec in tune_trials if wanted[spec.optimizer] is not None and spec.trial_id not in attempted
                 and math.isclose(spec.lr, wanted[spec.optimizer], rel_tol=1e-9)]  # type: ignore[arg-type]
        if not specs:  # every walk is done (or its next trial ran and left no record: stop rather than loop)
            tried = {(c.optimizer, key) for c in choices for key in tried_points(c)}
            return [spec for spec in tune_trials if spec.trial_id in attempted
                    or (spec.optimizer, _lr_key(spec.lr)) in tried]  # type: ignore[arg-type]
        attempted |= {spec.trial_id for spec in specs}
        run_sweep(specs, out, **sweep)


def run_study(names: Sequence[str], settings: dict[str, Any], budget: StudyBudget, out: Path, *,
              grids: dict[str, list[float]] | None = None, kwargs: dict[str, dict[str, Any]] | None = None,
              run_trial: Callable[[TrialSpec], Record] | None = None, executor: Executor | None = None,
              jobs: int = 1, show: Callable[[str], None] = print_line) -> StudyResult:
    """Tune, choose each lr from the records in `out`, then run the finals; resumable by re-running."""
    grids = {name: (grids or {}).get(name) or lr_grid(name, budget.lr_points) for name in names}
    tune_trials = tune_specs(names, grids, settings, budget.tune_seeds, kwargs)
    final_seeds = [seed for seed in budget.seeds if seed not in budget.tune_seeds]
    progress = Progress(len(tune_trials) + len(names) * len(final_seeds), show)
    # The study prints its own progress lines (stage, lr, metric), so the runner's are turned off.
    sweep: dict[str, Any] = {"on_record": progress, "progress": None, "jobs": jobs, "executor": executor,
                             "run_trial": run_trial}
    if budget.search == "grid":
        run_sweep(tune_trials, out, **sweep)
    else:
        tune_trials = walk(names, grids, tune_trials, out, settings["steps"], sweep)
    extended = extensions(names, grids, tune_trials, out, settings, budget, kwargs)
    if extended:
        progress.total = progress.done + len(extended) + len(names) * len(final_seeds)
        run_sweep(extended, out, **sweep)
    tune_trials = [*tune_trials, *extended]
    grids = {name: sorted({*grids[name], *(s.lr for s in extended if s.optimizer == name)}) for name in names}
    choices = choices_from_file(names, grids, tune_trials, out, settings["steps"])
    for choice in choices:
        lr = "none" if choice.lr is None else f"{choice.lr:g}"
        note = tuning.range_note(choice, [s.lr_source for s in tune_trials if s.optimizer == choice.optimizer])
        print(f"optbench: {choice.optimizer}: lr {lr} ({choice.note}{'; ' + note if note else ''})", file=sys.stderr)
    if settings.get("target") is None:
        target, why = target_from_tuning(choices)
        if target is not None:
            settings = {**settings, "target": target}
            print(f"optbench: time-to-target threshold {choices[0].metric} {target:.4g}, fixed before the finals: "
                  f"{TARGET_SHARE:g} x the tune stage's best validation score of {_reference(choices).optimizer}",
                  file=sys.stderr)
        else:
            print(f"optbench: no time-to-target threshold fixed: {why}", file=sys.stderr)
    finals = final_specs(choices, final_seeds, settings, kwargs)
    progress.total = progress.done + len(finals)
    run_sweep(finals, out, **sweep)
    return StudyResult(choices, tune_trials, finals)
