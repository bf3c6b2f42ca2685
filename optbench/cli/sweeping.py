"""What `run` and `study` share: the job flags for the planner, the input check that fails in a second (`fit` runs it
too), the executor, one line per finished trial, the report and verdict at the end, and the exit status a sweep
ends with."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from optbench.cli.files import load_records
from optbench.cli.options import UsageError
from optbench.records import exits

if TYPE_CHECKING:
    from optbench.job.planner import Plan
    from optbench.records.record import Record


def job_flags(args: argparse.Namespace, out: Path) -> dict:
    """The parsed flags for the planner; `--state-map` becomes the folder the trials write their maps into."""
    return {**vars(args), "state_map_dir": str(out.with_suffix("") / "state-maps") if args.state_map else None}


def sweep(args: argparse.Namespace, plan, out: Path) -> list[Record]:
    """Check the inputs and the results file, record what cannot run here, run the rest; returns the new records."""
    from optbench.sweep import run_sweep
    from optbench.sweep.devices import DeviceError

    specs = plan.specs or [spec for spec, _ in plan.unavailable]
    check_inputs(specs[0], local=args.executor == "local", eval_size_given=args.eval_size is not None)
    check_out(out)
    jobs = args.jobs or 1
    chosen = executor(args, plan.specs, out, jobs)  # a misused flag is one line before anything else is said
    plan = with_lrs(plan)
    print(f"optbench: {len(plan.specs) + len(plan.unavailable)} trials -> {out}", file=sys.stderr)
    try:
        return run_sweep(plan.specs, out, on_record=show, jobs=jobs, executor=chosen, skipped=plan.unavailable)
    except DeviceError as exc:  # a cuda:N outside the GPUs this process may use
        raise UsageError(str(exc)) from None


def check_out(out: Path) -> None:
    """The results file a sweep appends to (and resumes from): writable, and where it already holds something, a
    results file. Text or another tool's JSON there ended `run` and `study` in a traceback from the resume read."""
    from optbench.records.record import ResultsFileError, read_records
    from optbench.records.writable import check_writable

    try:
        check_writable(out)
    except OSError as exc:
        raise UsageError(f"cannot write results to {out}: {exc.strerror or exc} (pass a writable file with --out)") \
            from None
    if not out.is_file():
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a torn last line is said when the sweep reads the file
            read_records(out)
    except ResultsFileError as exc:
        reason = exc.reason if exc.line is None else f"line {exc.line}: {exc.reason}"
        raise UsageError(f"--out {out} is not a results file ({reason}); name a new file or one optbench wrote") \
            from None


def check_run(args: argparse.Namespace, out: Path) -> None:
    """What `run` with `args` refuses before its first trial, asked without running one: `nightly` starts its sweep
    as a child `optbench run` after the benchmark suite (up to an hour on CPU), so it asks first."""
    from optbench.job import planner
    from optbench.job.spec import PRESETS

    plan = planner.plan_run(job_flags(args, out), PRESETS[args.preset], args.optimizers, args.seeds)
    specs = plan.specs or [spec for spec, _ in plan.unavailable]
    check_inputs(specs[0], local=args.executor == "local", eval_size_given=args.eval_size is not None)
    executor(args, plan.specs, out, 1)  # the placement flags; jobs 1: a warning about --jobs is the sweep's to say


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


def executor(args: argparse.Namespace, specs: list, out: Path, jobs: int):
    """The executor asked for; on CPU, `jobs` > 1 comes with a warning about timings."""
    from optbench import optimizers
    from optbench.job.devices import usable_cpu_cores
    from optbench.sweep import LocalExecutor

    if args.executor == "slurm":
        return slurm_executor(args, out)
    given = [flag for flag, dest in SLURM_FLAGS if getattr(args, dest, None) is not None]
    if given:
        raise UsageError(f"{given[0]} applies to --executor slurm")
    on_cpu = all(spec.device == "cpu" for spec in specs)
    if jobs > 1 and on_cpu:
        print(f"optbench: warning: {jobs} trials at once share this CPU's cores and memory bandwidth; their "
              "step times interfere (use --jobs 1 for timings you quote)", file=sys.stderr)
    cores = usable_cpu_cores()
    ranks = max(spec.nproc for spec in specs)
    if on_cpu and args.threads and args.threads * jobs * ranks > cores:
        print(f"optbench: warning: --threads {args.threads} x {jobs} trial(s) at once x {ranks} rank(s) is more than "
              f"the {cores} cores this process may use: the step times measured are threads contending for them",
              file=sys.stderr)
    uses_bitsandbytes = any(optimizers.resolve(s.optimizer).library.startswith("bitsandbytes") for s in specs)
    return LocalExecutor(uses_bitsandbytes=uses_bitsandbytes)


SLURM_FLAGS = (("--slurm-partition", "slurm_partition"), ("--slurm-time", "slurm_time"),
               ("--gpus-per-trial", "gpus_per_trial"), ("--slurm-account", "slurm_account"),
               ("--slurm-max-running", "slurm_max_running"), ("--slurm-pending-timeout", "slurm_pending_timeout"),
               ("--slurm-option", "slurm_option"))


def slurm_executor(args: argparse.Namespace, out: Path):
    """Each round of trials as one Slurm job array; submitit's files in <out without .jsonl>/slurm/, the trial logs
    in <out without .jsonl>/logs/ (both must be on storage the nodes share, like the results file)."""
    if (args.jobs or 1) > 1:
        raise UsageError("--jobs runs trials side by side on this machine; with --executor slurm the array runs "
                         "them (cap: --slurm-max-running)")
    try:
        from optbench.sweep import slurm, slurm_queue

        executor = slurm.SlurmExecutor(out.with_suffix("") / "slurm", slurm_options(args))
        slurm_queue.partition_gpus(None)  # the controller answers: fail here, not at the first submission
    except ImportError:
        raise UsageError("--executor slurm needs submitit: pip install 'optbench[slurm]'") from None
    except RuntimeError as exc:  # submitit finds no srun, or the controller does not answer
        raise UsageError(f"--executor slurm: {exc} (use --executor local)") from None
    return executor


def slurm_options(args: argparse.Namespace):
    """The --slurm-* flags and --gpus-per-trial as slurm.SlurmOptions."""
    from optbench.sweep.slurm import SlurmOptions

    kind, _, count = (args.gpus_per_trial or "").rpartition(":")
    extra = {}
    for item in args.slurm_option or ():
        key, sep, value = item.partition("=")
        extra[key.strip().lstrip("-").replace("_", "-")] = value.strip() if sep else True
    given = {"partition": args.slurm_partition, "time_min": args.slurm_time, "account": args.slurm_account,
             "max_running": args.slurm_max_running, "pending_timeout_s": args.slurm_pending_timeout,
             "gpus_per_trial": int(count) if count else None, "gpu_type": kind or None}
    return SlurmOptions(sbatch_options=extra, **{k: v for k, v in given.items() if v is not None})


def check_inputs(spec, local: bool = True, eval_size_given: bool = False) -> None:
    """Ask the workload to check the dataset and model in this process first, so bad input fails in a second; the
    device too, but a CUDA device only where trials run here (a cluster's GPUs are its nodes', not the submit
    host's). A --eval-size past the held-out rows is said, not refused (every row is evaluated and the record's
    eval_rows says how many): a preset's size must serve a small dataset too, so only a size the user gave is."""
    from optbench.job.devices import resolve_device
    from optbench.records.environment import names_cuda
    from optbench.trial.precision import parse_precision
    from optbench.workloads import WorkloadError, get_workload

    try:
        if local or not names_cuda(spec.device):
            resolve_device(spec.device)
        parse_precision(spec.precision)
        workload = get_workload(spec.workload)
        workload.check(spec)
        held_out = workload.held_out_rows(spec) if eval_size_given else None
    except (WorkloadError, ValueError, RuntimeError) as exc:
        raise UsageError(str(exc)) from None
    if held_out is not None and spec.eval_size > held_out:
        print(f"optbench: warning: --eval-size {spec.eval_size} is more than the {held_out} held-out rows this job "
              f"has: all {held_out} are evaluated (the record's eval_rows)", file=sys.stderr)


def show(record: Record) -> None:
    print(summary_line(record), flush=True)


def summary_line(record: Record) -> str:
    """`run`'s result on stdout, one line per finished trial as the sweep runs: what it measured (state, training
    memory, step time, score). Not progress: sweep/progress.py's line on stderr says where the sweep stands."""
    from optbench.records.peaks import on_cuda, train_memory_bytes
    from optbench.report.bounds import score_text

    head = f"{record.optimizer:<12} seed={record.seed} {record.status:<8}"
    if record.status != "ok":
        return f"{head} {record.error or ''}"
    memory = f"{'peak CUDA' if on_cuda(record) else 'train mem'} {_mib(train_memory_bytes(record))}"  # the report's
    metrics = record.val_metrics if not record.eval_metrics else record.eval_metrics
    value = metrics.get(record.target_metric)
    score = (f"{record.target_metric} {score_text(value, record.metric_chance, record.target_mode)}"
             if value is not None else f"no {record.target_metric}")
    # a one-step job has no timed step: its only step is the warm-up, which timing leaves out
    step = (f"step {record.step_time_median_s * 1e3:,.0f} ms" if record.step_time_median_s is not None
            else "no timed step")
    said = f"state {_mib(record.state_bytes, 1)}, {memory}, {step}, {score}{_resumed(record)}"
    return f"{head} {said} [{record.wall_s:.0f} s]"


def _resumed(record: Record) -> str:
    """--resume-check's outcome where the user watches, as the report's resume column says it."""
    if record.resume_status is None:
        return ""
    if record.resume_status == "exact" or record.resume_max_abs_param_diff is None:
        return f", resume {record.resume_status}"
    return f", resume {record.resume_status} (max Δparam {record.resume_max_abs_param_diff:.2g})"


def _mib(size_bytes: int | None, decimals: int = 0) -> str:
    """A size in MiB for the running summary; 'n/a' where the trial did not measure it."""
    from optbench.records.record import MIB

    return "n/a" if size_bytes is None else f"{size_bytes / MIB:,.{decimals}f} MiB"


def finish(args: argparse.Namespace, out: Path) -> None:
    """The answer where the user looks: the verdict in words and a table that fits the terminal; the full report
    goes to files beside the results, whose paths are printed."""
    from optbench.report.render import render_terminal, summarize, trials_frame, write_report

    everything = load_records([out])
    if not everything:
        return
    summary = summarize(trials_frame(everything), args.margin)  # once, for the files and the terminal
    report_dir = out.with_suffix("")
    try:
        _, paths = write_report(everything, report_dir, figures=not args.no_figures, margin=args.margin,
                                summary=summary)
    except OSError as exc:
        raise UsageError(f"cannot write the report into {report_dir}: {exc.strerror or exc}") from None
    print(render_terminal(summary), end="")
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
