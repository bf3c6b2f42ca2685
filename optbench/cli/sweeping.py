"""What `run` and `study` share: the job flags for the planner, the input check that fails in a second, the
executor, one line per finished trial, the report and verdict at the end, and the exit status a sweep ends with."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from optbench.cli.options import UsageError, load_records
from optbench.records import exits

if TYPE_CHECKING:
    from optbench.job.planner import Plan
    from optbench.records.record import Record


def job_flags(args: argparse.Namespace, out: Path) -> dict:
    """The parsed flags for the planner; `--state-map` becomes the folder the trials write their maps into."""
    return {**vars(args), "state_map_dir": str(out.with_suffix("") / "state-maps") if args.state_map else None}


def sweep(args: argparse.Namespace, plan, out: Path) -> list[Record]:
    """Check the inputs and the results file, record what cannot run here, run the rest; returns the new records."""
    from optbench.records.record import check_writable
    from optbench.sweep import run_sweep
    from optbench.sweep.runner import record_skipped

    specs = plan.specs or [spec for spec, _ in plan.unavailable]
    check_inputs(specs[0])
    try:
        check_writable(out)
    except OSError as exc:
        raise UsageError(f"cannot write results to {out}: {exc.strerror or exc} (pass a writable file with --out)") \
            from None
    plan = with_lrs(plan)
    chosen = executor(args, plan.specs, out)
    skipped = [record_skipped(spec, reason, out, show) for spec, reason in plan.unavailable]
    print(f"optbench: {len(plan.specs) + len(skipped)} trials -> {out}", file=sys.stderr)
    return skipped + run_sweep(plan.specs, out, on_record=show, jobs=args.jobs, executor=chosen)


def with_lrs(plan: Plan) -> Plan:
    """Each trial's lr settled before it runs (so its trial id holds it), and one line per optimizer saying where it
    came from: --lr, a committed study's choice for this job (job/tuned.py), or the registry's untuned default."""
    from optbench import optimizers
    from optbench.workloads import LR_DEFAULT, lr_for

    specs, said = [], set()
    for spec in plan.specs:  # the inputs are checked: the workload exists
        lr, source = lr_for(spec, optimizers.resolve(spec.optimizer))
        specs.append(dataclasses.replace(spec, lr=lr, lr_source=source))
        if spec.optimizer not in said:
            said.add(spec.optimizer)
            where = {LR_DEFAULT: ": the registry's untuned default (`optbench study` tunes it for this job)",
                     "user": " (--lr)"}.get(source, f", {source}")
            print(f"optbench: {spec.optimizer} lr {lr:g}{where}", file=sys.stderr)
    return dataclasses.replace(plan, specs=specs)


def executor(args: argparse.Namespace, specs: list, out: Path):
    """The executor asked for; on CPU, --jobs > 1 comes with a warning about timings."""
    from optbench import optimizers
    from optbench.sweep import LocalExecutor, SubmititExecutor

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


def check_inputs(spec) -> None:
    """Ask the workload to check the dataset and model in this process first, so bad input fails in a second."""
    from optbench.trial.precision import parse_precision
    from optbench.trial.run import resolve_device
    from optbench.workloads import WorkloadError, get_workload

    try:
        resolve_device(spec.device)
        parse_precision(spec.precision)
        get_workload(spec.workload).check(spec)
    except (WorkloadError, ValueError, RuntimeError) as exc:
        raise UsageError(str(exc)) from None


def show(record: Record) -> None:
    print(summary_line(record), flush=True)


def summary_line(record: Record) -> str:
    """One line per finished trial, while the sweep runs."""
    from optbench.records.record import MIB

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


def finish(args: argparse.Namespace, out: Path) -> None:
    """The answer where the user looks: the verdict in words and a table that fits the terminal; the full report
    goes to files beside the results, whose paths are printed."""
    from optbench.report.render import render_terminal, write_report

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


def exit_status(args: argparse.Namespace, records: list) -> int:
    """3 when a trial ended `error` or `timeout` (a harness or library failure), with one line naming them."""
    from optbench.records.record import FAILURES

    failed = [r for r in records if r.status in FAILURES]
    if not failed or args.allow_errors:
        return exits.OK
    names = ", ".join(f"{r.optimizer} seed {r.seed} ({r.status})" for r in failed[:6])
    more = f" and {len(failed) - 6} more" if len(failed) > 6 else ""
    print(f"optbench: {len(failed)} trial(s) ended error/timeout: {names}{more}; see the results file "
          "(--allow-errors: exit 0)", file=sys.stderr)
    return exits.TRIAL_FAILED
