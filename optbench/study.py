"""`study`: a fair comparison in two stages of ordinary trials, all in one results file.

1. Tune: each optimizer over its lr grid, seed 0, scored on a validation split carved from the *training*
   data (`stage="tune"`), so the eval split never picks the lr it is later reported on.
2. Final: each optimizer at the lr chosen from the tune records, over several seeds, on the eval split
   (`stage="final"`), with an eval curve for time-to-target.

The lr choice is always recomputed from the records in the results file, so killing a study and running
the same command again skips every trial already `ok` and arrives at the same choice.

Choosing the lr: among the grid points whose tune trial finished `ok` with a finite validation metric,
take the best (larger for `target_mode` "max", smaller for "min"). Points within `TIE_POINTS` (half a
point: 0.005 of a fraction-valued metric such as accuracy, 0.5 % of the value otherwise) of the best are
a near-tie, decided toward the lr closest (in log distance) to the geometric middle of the grid, since a
score that differs by less than the seed noise should not drag the choice to the edge of the grid; an
exact tie in that distance goes to the smaller lr.
Failed, diverged and timed-out points never win, but stay in the report and the sensitivity figure.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optbench import optimizers, stats
from optbench.plan import TrialSpec
from optbench.results import Record, read_records

TIE_POINTS = 0.5


def lr_grid(name: str, points: int) -> list[float]:
    """The registry's grid for this optimizer: `points` log-spaced lrs inside its lr range, its default among them."""
    return sorted(float(lr) for lr in optimizers.resolve(name).lr_grid(points))


@dataclass(frozen=True)
class LrPoint:
    lr: float
    status: str  # the tune trial's status, "missing" when it has not run yet
    value: float | None  # validation metric; None unless status is ok and the value finite


@dataclass
class LrChoice:
    """The tune stage's outcome for one optimizer: every grid point, and the lr chosen (None: none ok)."""

    optimizer: str
    points: list[LrPoint]
    metric: str
    mode: str
    tune_steps: int
    lr: float | None = None
    note: str = ""
    tunability: float | None = field(default=None)


def choose_lr(points: Sequence[LrPoint], mode: str) -> tuple[float | None, str]:
    """(chosen lr, why) by the rule in this module's docstring; (None, why) when no point is usable."""
    usable = [p for p in points if p.status == "ok" and p.value is not None and math.isfinite(p.value)]
    if not usable:
        return None, "no tune trial finished ok"
    best = stats.best_value([p.value for p in usable], mode)  # type: ignore[misc]
    near = [p for p in usable if stats.within(p.value, best, TIE_POINTS)]  # type: ignore[arg-type]
    lrs = [p.lr for p in points]
    middle = math.sqrt(min(lrs) * max(lrs))
    chosen = min(near, key=lambda p: (abs(math.log(p.lr / middle)), p.lr))
    if len(near) == 1:
        return chosen.lr, "best validation metric"
    return chosen.lr, (f"{len(near)} lrs within {TIE_POINTS:g} pt of the best; took the one nearest the "
                       f"grid's geometric middle {middle:.3g}")


def choice_from_records(optimizer: str, grid: Sequence[float], records: Iterable[Record],
                        tune_steps: int) -> LrChoice:
    """Rebuild one optimizer's lr choice from its tune records (latest record per lr wins)."""
    by_lr: dict[float, Record] = {}
    for record in records:
        by_lr[float(record.lr)] = record
    metric = next((r.target_metric for r in by_lr.values()), "accuracy")
    mode = next((r.target_mode for r in by_lr.values()), "max")
    points = []
    for lr in grid:
        record = _match(by_lr, lr)
        value = record.val_metric if record is not None and record.status == "ok" else None
        points.append(LrPoint(lr, record.status if record else "missing",
                              float(value) if value is not None and math.isfinite(value) else None))
    lr, note = choose_lr(points, mode)
    return LrChoice(optimizer, points, metric, mode, tune_steps, lr, note,
                    stats.tunability([p.value for p in points], mode))


def _match(by_lr: dict[float, Record], lr: float) -> Record | None:
    """The record at this lr, tolerating the float round trip through JSON."""
    return next((r for key, r in by_lr.items() if math.isclose(key, lr, rel_tol=1e-9)), None)


def tune_specs(names: Sequence[str], grids: dict[str, list[float]], settings: dict[str, Any],
               tune_steps: int, warmup_steps: int) -> list[TrialSpec]:
    """Seed 0, every lr of every optimizer, lr outermost so a killed tune stage covers all optimizers."""
    common = {**settings, "steps": tune_steps, "warmup_steps": warmup_steps, "stage": "tune", "seed": 0,
              "eval_every": 0, "target": None}
    points = max(len(grid) for grid in grids.values())
    return [TrialSpec(optimizer=name, lr=grids[name][i], **common)
            for i in range(points) for name in names if i < len(grids[name])]


def final_specs(choices: Sequence[LrChoice], seeds: Sequence[int], settings: dict[str, Any]) -> list[TrialSpec]:
    """Each optimizer with a chosen lr, once per seed (seeds outermost)."""
    return [TrialSpec(optimizer=c.optimizer, lr=c.lr, seed=seed, stage="final", **settings)
            for seed in seeds for c in choices if c.lr is not None]


def print_line(line: str) -> None:
    """Flushed at once, so progress shows in a log file or CI output while the study runs."""
    print(line, flush=True)


class Progress:
    """One line per trial: `[i/N] optimizer stage lr seed status … ETA` (ETA from the trials run so far)."""

    def __init__(self, total: int, show: Callable[[str], None] = print_line) -> None:
        self.total, self.done, self.ran, self.show = total, 0, 0, show
        self.started = time.perf_counter()

    def __call__(self, record: Record) -> None:
        self.done += 1
        resumed = record.status == "skipped" and "already recorded" in (record.error or "")
        self.ran += not resumed
        elapsed = time.perf_counter() - self.started
        left = self.total - self.done
        eta = f"ETA {elapsed / self.ran * left / 60:.1f} min" if self.ran and left > 0 else "ETA -"
        if resumed:
            self.show(f"[{self.done}/{self.total}] {record.optimizer} seed={record.seed} already ok | {eta}")
            return
        metric = record.val_metric if record.stage == "tune" else (record.eval_metrics or {}).get(
            record.target_metric, record.eval_accuracy)
        value = f" {record.target_metric} {metric:.4g}" if isinstance(metric, float) else ""
        self.show(f"[{self.done}/{self.total}] {record.optimizer} {record.stage or ''} lr={record.lr:g} "
                  f"seed={record.seed} {record.status}{value} | {eta}")


@dataclass
class StudyResult:
    choices: list[LrChoice]
    tune: list[TrialSpec]
    final: list[TrialSpec]


def run_study(names: Sequence[str], settings: dict[str, Any], *, lr_points: int, tune_steps: int,
              tune_warmup_steps: int, seeds: Sequence[int], out: Path, grids: dict[str, list[float]] | None = None,
              run_trial: Callable[[TrialSpec], Record] | None = None,
              show: Callable[[str], None] = print_line) -> StudyResult:
    """Tune, choose each lr from the records in `out`, then run the finals; resumable by re-running."""
    from optbench.runner import run_sweep

    grids = {name: (grids or {}).get(name) or lr_grid(name, lr_points) for name in names}
    tuning = tune_specs(names, grids, settings, tune_steps, tune_warmup_steps)
    progress = Progress(len(tuning) + len(names) * len(seeds), show)
    # The study prints its own progress lines (stage, lr, metric), so the runner's are turned off.
    kwargs: dict[str, Any] = {"on_record": progress, "progress": None}
    if run_trial is not None:
        kwargs["run_trial"] = run_trial
    run_sweep(tuning, out, **kwargs)
    records = read_records(out) if out.is_file() else []
    ids = {spec.trial_id: spec for spec in tuning}
    choices = []
    for name in names:
        own = [r for r in records if r.trial_id in ids and ids[r.trial_id].optimizer == name]
        choice = choice_from_records(name, grids[name], own, tune_steps)
        choices.append(choice)
        lr = "none" if choice.lr is None else f"{choice.lr:g}"
        print(f"optbench: {name}: lr {lr} ({choice.note})", file=sys.stderr)
    finals = final_specs(choices, seeds, settings)
    progress.total = len(tuning) + len(finals)
    run_sweep(finals, out, **kwargs)
    return StudyResult(choices, tuning, finals)
