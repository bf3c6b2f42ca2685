"""`optbench run`: one job, once per optimizer x seed (or, with `--scale`, across the tiny BERT's widths)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from optbench.cli.files import load_records
from optbench.cli.options import UsageError
from optbench.cli.sweeping import exit_status, finish, job_flags, sweep


def run_command(args: argparse.Namespace) -> int:
    from optbench.job import planner
    from optbench.job.spec import PRESETS

    if args.scale:
        return scale(args)
    if args.widths:
        raise UsageError("--widths only applies with --scale")
    out = args.out or Path("results") / f"{args.preset}.jsonl"
    plan = planner.plan_run(job_flags(args, out), PRESETS[args.preset], args.optimizers, args.seeds)
    records = sweep(args, plan, out)
    finish(args, out)
    return exit_status(args, records)


def scale(args: argparse.Namespace) -> int:
    from optbench.job import planner
    from optbench.workflows import scaling

    if args.workload or args.model:
        raise UsageError("--scale sweeps the tiny BERT's widths; drop --workload/--model")
    plan = planner.plan_run({**vars(args), "workload": "tiny"}, scaling.SCALE_PRESET, args.optimizers, args.seeds)
    try:
        specs = scaling.across_widths(plan.specs + [spec for spec, _ in plan.unavailable],
                                      args.widths or scaling.SCALE_WIDTHS)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    out = args.out or scaling.SCALE_OUT
    records = sweep(args, planner.split_unavailable(specs), out)
    markdown, figure = scaling.write_scaling(load_records([out]), out)
    print(markdown, end="")
    print(f"wrote {figure}", file=sys.stderr)
    return exit_status(args, records)
