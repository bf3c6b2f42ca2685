"""`optbench nightly`: one night of benchmarking (optbench/workflows/nightly.py runs it; this module builds its
configuration from the flags and turns the night into an exit status)."""

from __future__ import annotations

import argparse
import sys

from optbench.cli import options
from optbench.cli.options import UsageError, job_argv
from optbench.cli.report import with_overrides
from optbench.cli.sweeping import check_run
from optbench.records import exits, nvidia


def default_device(args: argparse.Namespace) -> None:
    """No --device: the nightly workflow's GPU, `cuda`, said as the default it is where there is none."""
    from optbench.job.devices import cuda_device_count

    if args.device is None:
        if cuda_device_count() == 0:
            raise UsageError("a night runs on cuda unless --device says otherwise, and this torch build sees no "
                             "CUDA device: give --device cpu for a CPU night")
        args.device = "cuda"


def nightly_command(args: argparse.Namespace) -> int:
    from optbench.job import planner
    from optbench.job.devices import device_kind
    from optbench.report.compare import thresholds_for
    from optbench.workflows import nightly

    if args.print_baseline_key:
        given = [flag for flag, value in (("--baseline", args.baseline), ("--out", args.out)) if value is not None]
        if given:
            raise UsageError(f"--print-baseline-key prints the key and runs no night; drop {' and '.join(given)}")
        default_device(args)
        try:
            print(nvidia.baseline_key(nightly.night_environment(args.device)))
        except nightly.NightlyError as exc:
            raise UsageError(str(exc)) from None
        return exits.OK
    missing = [flag for flag, value in (("--baseline", args.baseline), ("--out", args.out)) if value is None]
    if missing:  # said before the device: what the command needs at all comes first
        raise UsageError(f"nightly needs {' and '.join(missing)} (or --print-baseline-key alone)")
    default_device(args)
    names = tuple(planner.resolve_names(args.optimizers)) if args.optimizers else ()
    limits = with_overrides(thresholds_for(device_kind(args.device)), args)
    config = nightly.NightConfig(device=args.device, preset=args.preset, baseline=args.baseline, out=args.out,
                                 thresholds=limits, optimizers=names, job_argv=tuple(job_argv(args)),
                                 strict_env=args.strict_env, accept=args.accept)
    try:
        # The sweep is `optbench run` in a child, after the benchmark suite: its flags are checked now, as run does.
        check_run(options.build_parser().parse_args(nightly.sweep_command(config, args.out / nightly.SWEEP_FILE)[3:]),
                  args.out / nightly.SWEEP_FILE)
        night = nightly.run_night(config)
    except nightly.NightlyError as exc:
        raise UsageError(str(exc)) from None
    print((args.out / "summary.md").read_text(encoding="utf-8"))
    if night.trial_failures:
        print(f"optbench: the sweep had {night.trial_failures} trial(s) ending error/timeout; baseline kept",
              file=sys.stderr)
        return exits.TRIAL_FAILED
    if night.clean or args.accept:
        return exits.OK
    print(f"optbench: {len(night.regressions)} regression(s); baseline kept", file=sys.stderr)
    return exits.REGRESSION
