"""Command line: `python -m optbench run | study | list | report | compare | nightly | estimate | recommend |
explain | fit`. This module parses, calls and prints; planning is optbench/planner.py's, the flags options.py's.

Exit codes (one vocabulary for every command): 0 ok (`oom`, `diverged` and `skipped` trials are results);
1 a regression (compare, nightly) or nothing fits (recommend); 2 usage or set-up error (one line on stderr,
never a traceback); 3 a trial ended `error` or `timeout` (`--allow-errors`: 0); 130 / 143 interrupted by
SIGINT / SIGTERM, after the trials finished so far were recorded. torch and friends are imported only by the
commands that need them, so `list` and `report` start fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from optbench import sizing
from optbench.options import UsageError, build_parser, job_argv, load_records
from optbench.planner import PlanError
from optbench.process.runner import ResultsWriteError

if TYPE_CHECKING:
    from optbench.compare import Thresholds
    from optbench.results import Record

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, EXIT_TRIAL_FAILED = 0, 1, 2, 3


# -- run and study -------------------------------------------------------------------------------------------
def _run(args: argparse.Namespace) -> int:
    from optbench import planner
    from optbench.plan import PRESETS

    if args.scale:
        return _scale(args)
    if args.widths:
        raise UsageError("--widths only applies with --scale")
    out = args.out or Path("results") / f"{args.preset}.jsonl"
    plan = planner.plan_run(_flags(args, out), PRESETS[args.preset], args.optimizers, args.seeds)
    records = _sweep(args, plan, out)
    _finish(args, out)
    return _exit_status(args, records)


def _scale(args: argparse.Namespace) -> int:
    from optbench import planner, scaling

    if args.workload or args.model:
        raise UsageError("--scale sweeps the tiny BERT's widths; drop --workload/--model")
    plan = planner.plan_run({**vars(args), "workload": "tiny"}, scaling.SCALE_PRESET, args.optimizers, args.seeds)
    try:
        specs = scaling.across_widths(plan.specs + [spec for spec, _ in plan.unavailable],
                                      args.widths or scaling.SCALE_WIDTHS)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    out = args.out or scaling.SCALE_OUT
    records = _sweep(args, planner.split_unavailable(specs), out)
    markdown, figure = scaling.write_scaling(load_records([out]), out)
    print(markdown, end="")
    print(f"wrote {figure}", file=sys.stderr)
    return _exit_status(args, records)


def _flags(args: argparse.Namespace, out: Path) -> dict:
    """The parsed flags for the planner; `--state-map` becomes the folder the trials write their maps into."""
    return {**vars(args), "state_map_dir": str(out.with_suffix("") / "state-maps") if args.state_map else None}


def _sweep(args: argparse.Namespace, plan, out: Path) -> list[Record]:
    """Check the inputs and the results file, record what cannot run here, run the rest; returns the new records."""
    from optbench.process import run_sweep
    from optbench.process.runner import record_skipped
    from optbench.results import check_writable

    specs = plan.specs or [spec for spec, _ in plan.unavailable]
    _check_inputs(specs[0])
    try:
        check_writable(out)
    except OSError as exc:
        raise UsageError(f"cannot write results to {out}: {exc.strerror or exc} (pass a writable file with --out)") \
            from None
    executor = _executor(args, plan.specs, out)
    skipped = [record_skipped(spec, reason, out, _show) for spec, reason in plan.unavailable]
    print(f"optbench: {len(plan.specs) + len(skipped)} trials -> {out}", file=sys.stderr)
    return skipped + run_sweep(plan.specs, out, on_record=_show, jobs=args.jobs, executor=executor)


def _study(args: argparse.Namespace) -> int:
    from optbench import planner
    from optbench.plan import TrialSpec
    from optbench.process.runner import record_skipped
    from optbench.study import run_study

    out = args.out or Path("results") / f"study-{args.preset}.jsonl"
    plan = planner.plan_study(_flags(args, out), args.preset, args.optimizers)
    if out.exists() and not out.is_file():
        raise UsageError(f"--out {out} is not a file")
    specs = [TrialSpec(optimizer=name, **plan.settings) for name in plan.names] or [s for s, _ in plan.unavailable]
    _check_inputs(specs[0])
    for spec, reason in plan.unavailable:
        record_skipped(spec, reason, out, _show)
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
              executor=_executor(args, specs, out), jobs=args.jobs)
    _finish(args, out)
    return _exit_status(args, [r for r in load_records([out]) if r.optimizer in plan.names])


def _executor(args: argparse.Namespace, specs: list, out: Path):
    """The executor asked for; on CPU, --jobs > 1 comes with a warning about timings."""
    from optbench import optimizers
    from optbench.process import LocalExecutor, SubmititExecutor

    if args.executor == "slurm":
        try:
            return SubmititExecutor(out.parent / "submitit", cluster="slurm")
        except ImportError:
            raise UsageError("--executor slurm needs submitit: pip install 'optbench[slurm]'") from None
        except RuntimeError as exc:  # submitit finds no slurm here
            raise UsageError(f"--executor slurm: {exc} (use --executor local)") from None
    if args.jobs > 1 and all(spec.device == "cpu" for spec in specs):
        print(f"optbench: warning: {args.jobs} trials at once share this CPU's cores and memory bandwidth; their "
              "step times interfere (use --jobs 1 for timings you quote)", file=sys.stderr)
    uses_bitsandbytes = any(optimizers.resolve(s.optimizer).library.startswith("bitsandbytes") for s in specs)
    return LocalExecutor(uses_bitsandbytes=uses_bitsandbytes)


def _check_inputs(spec) -> None:
    """Ask the workload to check the dataset and model in this process first, so bad input fails in a second."""
    from optbench.precision import parse_precision
    from optbench.trial import resolve_device
    from optbench.workloads import WorkloadError, get_workload

    try:
        resolve_device(spec.device)
        parse_precision(spec.precision)
        get_workload(spec.workload).check(spec)
    except (WorkloadError, ValueError, RuntimeError) as exc:
        raise UsageError(str(exc)) from None


def _show(record: Record) -> None:
    print(_summary_line(record), flush=True)


def _summary_line(record: Record) -> str:
    """One line per finished trial, while the sweep runs."""
    from optbench.results import MIB

    head = f"{record.optimizer:<12} seed={record.seed} {record.status:<8}"
    if record.status != "ok":
        return f"{head} {record.error or ''}"
    memory = (f"peak CUDA {record.peak_cuda_allocated_bytes / MIB:,.0f} MiB"
              if record.peak_cuda_allocated_bytes is not None
              else f"train mem {record.peak_rss_growth_bytes / MIB:,.0f} MiB")
    metrics = record.val_metrics if not record.eval_metrics else record.eval_metrics
    value = metrics.get(record.target_metric)
    score = f"{record.target_metric} {value:.4g}" if value is not None else f"no {record.target_metric}"
    return (f"{head} state {record.state_bytes / MIB:,.1f} MiB, {memory}, step "
            f"{record.step_time_median_s * 1e3:,.0f} ms, {score} [{record.wall_s:.0f} s]")


def _finish(args: argparse.Namespace, out: Path) -> None:
    """The answer where the user looks: the verdict in words and a table that fits the terminal; the full report
    goes to files beside the results, whose paths are printed."""
    from optbench.report import render_terminal, write_report

    everything = load_records([out])
    if not everything:
        return
    report_dir = out.with_suffix("")
    try:
        _, paths = write_report(everything, report_dir, figures=not args.no_figures, margin=args.margin)
    except OSError as exc:
        raise UsageError(f"cannot write the report into {report_dir}: {exc.strerror or exc}") from None
    print(render_terminal(everything, margin=args.margin), end="")
    print(f"full report: {paths[0]}")
    print(textwrap.fill(f"beside it: {', '.join(p.name for p in paths[1:])}", width=120, subsequent_indent="  "))


def _exit_status(args: argparse.Namespace, records: list) -> int:
    """3 when a trial ended `error` or `timeout` (a harness or library failure), with one line naming them."""
    from optbench.results import FAILURES

    failed = [r for r in records if r.status in FAILURES]
    if not failed or args.allow_errors:
        return EXIT_OK
    names = ", ".join(f"{r.optimizer} seed {r.seed} ({r.status})" for r in failed[:6])
    more = f" and {len(failed) - 6} more" if len(failed) > 6 else ""
    print(f"optbench: {len(failed)} trial(s) ended error/timeout: {names}{more}; see the results file "
          "(--allow-errors: exit 0)", file=sys.stderr)
    return EXIT_TRIAL_FAILED


# -- reading, reporting, comparing -------------------------------------------------------------------------
def _report(args: argparse.Namespace) -> int:
    from optbench.report import write_report

    files = args.files or sorted(Path("results").glob("*.jsonl"))
    if not files:
        raise UsageError("no results files given and none in results/ (run `python -m optbench run` first)")
    records = load_records(files)
    if not records:
        raise UsageError(f"no records in {', '.join(map(str, files))}")
    try:
        text, paths = write_report(records, args.out_dir, fmt=args.format, margin=args.margin)
    except OSError as exc:
        raise UsageError(f"cannot write the report into {args.out_dir}: {exc.strerror or exc}") from None
    print(text, end="" if text.endswith("\n") else "\n")
    print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    return EXIT_OK


def _with_overrides(limits: Thresholds, args: argparse.Namespace) -> Thresholds:
    """The calibrated thresholds with the ones given on the command line (compare's and nightly's flags)."""
    given = {"max_slowdown_pct": args.max_slowdown, "max_memory_growth_pct": args.max_memory_growth,
             "max_accuracy_drop_pts": args.max_accuracy_drop, "min_peak_growth_mib": args.min_peak_growth,
             "max_metric_worsening_pct": args.max_metric_worsening}
    return dataclasses.replace(limits, **{key: value for key, value in given.items() if value is not None})


def _compare(args: argparse.Namespace) -> int:
    from optbench import compare

    runs = {}
    for role, path in (("BASE", args.base), ("NEW", args.new)):
        runs[role] = load_records([path])
        if not runs[role]:
            raise UsageError(f"no records in {role} {path}")
    limits = _with_overrides(compare.calibrated_thresholds(runs["BASE"], runs["NEW"]), args)
    try:
        comparison = compare.compare(runs["BASE"], runs["NEW"], limits)
    except compare.CompareError as exc:
        raise UsageError(str(exc)) from None
    if args.strict_env and comparison.env_differences:
        raise UsageError("--strict-env: BASE and NEW ran in different environments: "
                         + "; ".join(comparison.env_differences))
    print(compare.render_markdown(comparison))
    if args.export_github_benchmark:
        try:
            paths = compare.export_github_benchmark(comparison, args.export_github_benchmark)
        except OSError as exc:
            raise UsageError(f"cannot write {args.export_github_benchmark}: {exc.strerror or exc}") from None
        print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    if not comparison.regressions:
        return EXIT_OK
    print("Regressions:\n" + "\n".join(f"- {line}" for line in comparison.regressions))
    print(f"optbench: {len(comparison.regressions)} regression(s) beyond the thresholds", file=sys.stderr)
    return EXIT_REGRESSION


def _nightly(args: argparse.Namespace) -> int:
    from optbench import nightly, planner

    names = tuple(planner.resolve_names(args.optimizers)) if args.optimizers else ()
    limits = _with_overrides(nightly.thresholds_for(args.device), args)
    config = nightly.NightConfig(device=args.device, preset=args.preset, baseline=args.baseline, out=args.out,
                                 thresholds=limits, optimizers=names, job_argv=tuple(job_argv(args)),
                                 strict_env=args.strict_env, accept=args.accept)
    try:
        night = nightly.run_night(config)
    except nightly.NightlyError as exc:
        raise UsageError(str(exc)) from None
    print((args.out / "summary.md").read_text(encoding="utf-8"))
    if night.trial_failures:
        print(f"optbench: the sweep had {night.trial_failures} trial(s) ending error/timeout; baseline kept",
              file=sys.stderr)
        return EXIT_TRIAL_FAILED
    if night.clean or args.accept:
        return EXIT_OK
    print(f"optbench: {len(night.regressions)} regression(s); baseline kept", file=sys.stderr)
    return EXIT_REGRESSION


COMMANDS = {"run": _run, "study": _study, "report": _report, "compare": _compare, "nightly": _nightly,
            **sizing.COMMANDS}


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or CI's cancel, `timeout`), taken down the same path as Ctrl-C: the running
    trial's process group is killed, what was recorded stays, and the exit status says which signal."""


def _terminate(signum: int, frame: object) -> NoReturn:
    raise Terminated()


def _install_signal_handlers() -> dict[int, object]:
    """Our own SIGINT and SIGTERM handlers. A process started in the background by a script inherits SIGINT
    *ignored*, and Python then installs no KeyboardInterrupt handler: `kill -INT` must stop a sweep however it
    was started, so SIGINT gets Python's default handler explicitly."""
    try:
        return {signal.SIGTERM: signal.signal(signal.SIGTERM, _terminate),
                signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler)}
    except ValueError:  # not the main thread: leave signals to whoever owns it
        return {}


def main(argv: list[str] | None = None) -> int:
    previous = _install_signal_handlers()
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except (UsageError, PlanError) as exc:
        print(f"optbench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        recorded = getattr(exc, "recorded", 0)
        terminated = isinstance(exc, Terminated) or isinstance(exc.__context__, Terminated)
        print(f"optbench: {'terminated' if terminated else 'interrupted'}: {recorded} trials recorded, rerun the "
              "same command to resume", file=sys.stderr)
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)
    except ResultsWriteError as exc:  # the results file stopped taking records (disk full, ...)
        print(f"optbench: error: {exc.strerror or exc}; free space or pick another --out, then rerun to resume",
              file=sys.stderr)
        return EXIT_REGRESSION
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
