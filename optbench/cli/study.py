"""`optbench study`: tune each optimizer's lr on a validation split, then compare them over seeds
(optbench/workflows/study.py runs it; this module checks the input and prints)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from optbench.cli.files import load_records
from optbench.cli.options import UsageError
from optbench.cli.sweeping import check_inputs, check_out, executor, exit_status, finish, job_flags, show

if TYPE_CHECKING:
    from optbench.job.planner import StudyPlan


def study_command(args: argparse.Namespace) -> int:
    from optbench.job import planner
    from optbench.job.spec import TrialSpec
    from optbench.sweep import SweepInterrupted

    out = args.out or Path("results") / f"study-{args.preset}.jsonl"
    plan = planner.plan_study(job_flags(args, out), args.preset, args.optimizers)
    specs = [TrialSpec(optimizer=name, **plan.settings) for name in plan.names] or [s for s, _ in plan.unavailable]
    check_inputs(specs[0], local=args.executor == "local", eval_size_given=args.eval_size is not None)
    check_out(out)
    before = _lines(out)
    try:
        _run(args, plan, specs, out)
    except SweepInterrupted as exc:  # its count was the interrupted round's; the study's earlier rounds count too
        exc.recorded = _lines(out) - before
        raise
    finish(args, out)
    return exit_status(args, [r for r in load_records([out]) if r.optimizer in plan.names])


def _lines(path: Path) -> int:
    """Records in a results file (its non-blank lines; a torn one is the sweep's to say)."""
    return sum(1 for line in path.read_bytes().splitlines() if line.strip()) if path.is_file() else 0


def _run(args: argparse.Namespace, plan: StudyPlan, specs: list, out: Path) -> None:
    from optbench.sweep import run_sweep
    from optbench.workflows.study import run_study

    run_sweep([], out, on_record=show, progress=None, skipped=plan.unavailable)
    if not plan.names:
        raise UsageError("none of --optimizers can run here (see the skipped records)")
    grids = {name: plan.lr_grid for name in plan.names} if plan.lr_grid else None
    budget = plan.budget
    points = len(plan.lr_grid) if plan.lr_grid else budget.lr_points
    search = f"{points} lrs" if budget.search == "grid" else f"a walk over {points} lrs"
    print(f"optbench: study of {', '.join(plan.names)}: {search} "
          f"x tune seeds {','.join(map(str, budget.tune_seeds))} at {plan.settings['steps']} steps, then seeds "
          f"{','.join(map(str, budget.seeds))} at the chosen lr -> {out}", file=sys.stderr)
    run_study(plan.names, plan.settings, budget, out, grids=grids, kwargs=plan.optimizer_kwargs,
              executor=executor(args, specs, out, budget.jobs), jobs=budget.jobs)
