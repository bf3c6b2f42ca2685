"""Command line: `python -m optbench run | study | list | report | compare | nightly | estimate | recommend`.

Usage errors (unknown optimizer, bad numbers, missing files or columns) print one line on stderr and
exit with 2; nothing here prints a traceback for bad input. torch and friends are imported only by the
commands that need them, so `list` and `report` start fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import signal
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from optbench import optimizers
from optbench.engines import ENGINES
from optbench.engines.parallel import MODES as PARALLEL_MODES
from optbench.plan import PRECISIONS, PRESETS, STUDY_BUDGETS, StudyBudget, build_grid
from optbench.runner import ResultsWriteError

if TYPE_CHECKING:
    from optbench.compare import Thresholds

EXIT_USAGE = 2
EXIT_REGRESSION = 1  # `compare` found a row beyond its thresholds


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line instead of argparse's usage block
        raise UsageError(message)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _number(text: str, rule: str, ok: Callable[[float], bool]) -> float:
    """A float that passes `ok`; otherwise argparse's error says `rule` ("a positive finite number", ...)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
    return value


def _positive_float(text: str) -> float:
    return _number(text, "a positive finite number", lambda v: 0 < v < math.inf)


def _finite_float(text: str) -> float:
    return _number(text, "a finite number", math.isfinite)


def _non_negative_float(text: str) -> float:
    """A threshold: '10%', '10' and '10 %' all read as 10 (the unit is in the option's name)."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number such as 10 or 10%, got '{text}'") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None


def _name_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _param_count(text: str) -> int:
    from optbench.estimate import EstimateError, parse_count

    try:
        return parse_count(text)
    except EstimateError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _memory_size(text: str) -> int:
    from optbench.estimate import EstimateError, parse_bytes

    try:
        return parse_bytes(text)
    except EstimateError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="optbench", description="Which optimizer fits my memory budget, at what cost?")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = commands.add_parser("run", help="run the fine-tuning job once per optimizer x seed")
    run.add_argument("--preset", choices=sorted(PRESETS), default="default",
                     help="job size (smoke: seconds per optimizer; default: ~1.5 min per optimizer on CPU)")
    run.add_argument("--optimizers", type=_name_list, default=list(optimizers.DEFAULT_OPTIMIZERS),
                     help="comma-separated registry names or HF Trainer aliases (see `optbench list`), "
                          "or 'all' for every entry available here")
    run.add_argument("--optimizer-kwargs", action="append", default=[], metavar="NAME=JSON",
                     help="extra constructor kwargs for one optimizer, e.g. 'adamw8bit={\"betas\": [0.9, 0.95]}' "
                          "(repeatable)")
    run.add_argument("--workload", help="minilm (pretrained BERT classifier, default), lm (causal LM from "
                                        "scratch) or tiny (random-init BERT, for tests); see optbench.workloads")
    run.add_argument("--precision", choices=PRECISIONS, default="fp32",
                     help="fp32 | bf16-autocast | fp16-autocast | bf16 (bf16 weights and grads, no fp32 master)")
    run.add_argument("--engine", choices=ENGINES, default="native",
                     help="training loop: native (optbench's own), trainer (HF Trainer) or accelerate")
    run.add_argument("--parallel", choices=("none", *PARALLEL_MODES), default="none",
                     help="data-parallel mode across --nproc processes (torchrun): ddp, zero1 (state sharded) "
                          "or fsdp2 (weights, grads and state sharded)")
    run.add_argument("--nproc", type=_positive_int, help="processes (ranks) for --parallel (default 2)")
    run.add_argument("--eval-every", type=_positive_int,
                     help="evaluate a fixed eval subset every K steps (untimed): eval curve and time to target")
    run.add_argument("--target", type=_finite_float,
                     help="time-to-target threshold on the workload's target metric (e.g. 0.9 accuracy)")
    run.add_argument("--model", help="HF model id or local folder, instead of the workload's model")
    run.add_argument("--dataset", help="HF dataset name[:config] or a local .csv/.json/.jsonl/.parquet")
    run.add_argument("--text-column", default="text")
    run.add_argument("--label-column", default="label")
    run.add_argument("--steps", type=_positive_int)
    run.add_argument("--warmup-steps", type=int, help="steps kept out of the timing medians (and lr warm-up)")
    run.add_argument("--batch-size", type=_positive_int)
    run.add_argument("--seq-len", type=_positive_int)
    run.add_argument("--eval-size", type=_positive_int)
    run.add_argument("--lr", type=_positive_float, help="one lr for all (default: each optimizer's own)")
    run.add_argument("--seeds", type=_int_list, help="comma-separated seeds, e.g. 0,1,2")
    run.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    run.add_argument("--timeout", type=_positive_float, help="seconds per trial before it is killed")
    run.add_argument("--out", type=Path, help="results file (default: results/<preset>.jsonl); resumed if present")
    run.add_argument("--fidelity", action="store_true",
                     help="also step a shadow fp32 AdamW; record update cosine / rel. error (inflates memory)")
    run.add_argument("--scale", action="store_true",
                     help="scaling sweep: tiny BERT at several widths, few steps; fits state bytes vs params "
                          "(default out: results/scaling.jsonl, writes scaling.png beside it)")
    run.add_argument("--widths", type=_int_list, help="with --scale: hidden widths (default 32,64,128,256,512)")
    run.add_argument("--jobs", type=_positive_int, default=1,
                     help="trials at once: one GPU each on CUDA; on CPU the cores are shared (timings interfere)")
    run.add_argument("--executor", choices=["local", "slurm"], default="local",
                     help="local processes, or one slurm job per trial through submitit (pip install submitit)")
    run.add_argument("--max-memory", type=_memory_size, metavar="SIZE",
                     help="cap on the memory each trial adds (RLIMIT_AS), e.g. 8GiB: past it the trial is `oom`")

    _add_study_parser(commands)

    commands.add_parser("list", help="registered optimizers: availability, precision, state bytes/param")

    report = commands.add_parser("report", help="tabulate results files (default: results/*.jsonl)")
    report.add_argument("files", nargs="*", type=Path)
    report.add_argument("--out-dir", type=Path, default=Path("results"),
                        help="where report.md, summary.csv and the PNG figures go (default: results/)")
    report.add_argument("--format", choices=["md", "csv", "json", "html"], default="md",
                        help="what is printed (md default); html also writes report.html with the figures")

    compare = commands.add_parser("compare", help="BASE vs NEW per optimizer and job; exit 1 on a regression")
    for name in ("base", "new"):
        compare.add_argument(name, type=Path, help="results .jsonl, pytest-benchmark .json, or a folder of .json")
    compare.add_argument("--max-slowdown", type=_non_negative_float, metavar="PCT",
                         help="step or optimizer-step time growth allowed, in %% (default: the device's calibrated "
                              "value, 25%% on CPU, 5%% on CUDA; docs/benchmarks.md)")
    compare.add_argument("--max-memory-growth", type=_non_negative_float, metavar="PCT",
                         help="peak-memory or state growth allowed, in %% (default: calibrated, 5%% CPU, 2%% CUDA)")
    compare.add_argument("--max-accuracy-drop", type=_non_negative_float, metavar="PTS",
                         help="eval-accuracy drop allowed, in percentage points (default 1.0)")
    compare.add_argument("--min-peak-growth", type=_non_negative_float, metavar="MIB",
                         help="a peak must also grow by more than this many MiB (default: 64 on CPU, its RSS "
                              "jitter; 0 on CUDA)")
    compare.add_argument("--strict-env", action="store_true",
                         help="refuse (exit 2) runs whose environments differ (machine, versions, threads) "
                              "instead of warning in the table's header")
    compare.add_argument("--export-github-benchmark", type=Path, metavar="FILE",
                         help="write NEW's numbers for github-action-benchmark: FILE (customSmallerIsBetter: "
                              "times, memory) and FILE-accuracy (customBiggerIsBetter)")

    nightly = commands.add_parser("nightly", help="one night: benchmark suite, sweep, reports, compare with "
                                                  "BASELINE (rotated only when clean); exit 1 on a regression")
    nightly.add_argument("--device", default="cuda", help="cpu, cuda or cuda:N (default cuda)")
    nightly.add_argument("--preset", choices=["smoke", "nightly"], default="nightly",
                         help="size of the sweep and of the benchmark suite (default nightly)")
    nightly.add_argument("--baseline", type=Path, required=True,
                         help="folder with the last clean night; empty or absent: this night becomes it")
    nightly.add_argument("--out", type=Path, required=True, help="folder for this night's results and summary.md")
    nightly.add_argument("--optimizers", type=_name_list, help="a subset (default: the sweep's set, the whole suite)")
    nightly.add_argument("--workload", help="sweep workload instead of the preset's (e.g. tiny for a quick CPU night)")
    for flag, unit in (("--max-slowdown", "PCT"), ("--max-memory-growth", "PCT"), ("--max-accuracy-drop", "PTS"),
                       ("--min-peak-growth", "MIB")):
        nightly.add_argument(flag, type=_non_negative_float, metavar=unit,
                             help="override the device's calibrated threshold (docs/benchmarks.md)")
    nightly.add_argument("--strict-env", action="store_true",
                         help="a baseline from another environment is an error (exit 2), not a warning")
    nightly.add_argument("--accept", action="store_true",
                         help="an intended change: report the comparison, then make this night the baseline "
                              "even if it regressed (exit 0)")

    estimate = commands.add_parser("estimate", help="weights + grads + optimizer state memory, before running")
    size = estimate.add_mutually_exclusive_group(required=True)
    size.add_argument("--params", type=_param_count, help="parameter count: 65783042, 7e9 or 7B")
    size.add_argument("--model", help="local model folder or HF id: counted from its config on the meta device")
    estimate.add_argument("--num-labels", type=_positive_int,
                          help="with --model: add a sequence-classification head with this many classes")
    estimate.add_argument("--results", type=Path, help="results file: use its measured state bytes/param")
    estimate.add_argument("--gpus", type=_positive_int, default=1,
                          help="data-parallel GPUs; >1 adds ZeRO-1/2/3 columns (state / + grads / + weights sharded)")
    estimate.add_argument("--gpu-memory", type=_memory_size, help="memory per GPU, e.g. 80GiB, 24GB: says what fits")
    estimate.add_argument("--precision", choices=PRECISIONS, default="fp32",
                          help="training precision: bf16 means 2-byte weights and grads (autocast keeps fp32 ones)")

    recommend = commands.add_parser("recommend", help="which optimizers fit a memory budget, best trade-offs first")
    size = recommend.add_mutually_exclusive_group(required=True)
    size.add_argument("--params", type=_param_count, help="parameter count: 65783042, 7e9 or 7B")
    size.add_argument("--model", help="local model folder or HF id: counted from its config on the meta device")
    recommend.add_argument("--gpu-memory", type=_memory_size, required=True, help="memory per GPU, e.g. 24GiB")
    recommend.add_argument("--results", type=Path,
                           help="results file: adds the activation overhead and accuracy measured there")
    recommend.add_argument("--precision", choices=PRECISIONS,
                           default="fp32", help="training precision (bf16: 2-byte weights, grads and state)")
    return parser


def _float_list(text: str) -> list[float]:
    values = [_positive_float(part) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive numbers, got '{text}'")
    return values


def _add_study_parser(commands) -> None:
    study = commands.add_parser("study", help="tune each optimizer's lr on a validation split, then compare "
                                              "them at their best lr over several seeds")
    study.add_argument("--preset", choices=sorted(PRESETS), default="study",
                       help="job size (study: <= 30 min for 3 optimizers on 2 CPU cores; smoke: <= 3 min)")
    study.add_argument("--optimizers", type=_name_list, default=list(optimizers.DEFAULT_OPTIMIZERS),
                       help="comma-separated registry names or HF Trainer aliases (see `optbench list`)")
    study.add_argument("--workload", help="minilm (pretrained BERT classifier, default), lm (causal LM from "
                                          "scratch) or tiny (random-init BERT, for tests)")
    study.add_argument("--precision", choices=PRECISIONS, default="fp32",
                       help="fp32 | bf16-autocast | fp16-autocast | bf16 (bf16 weights and grads, no fp32 master)")
    study.add_argument("--model", help="HF model id or local folder, instead of the workload's model")
    study.add_argument("--dataset", help="HF dataset name[:config] or a local .csv/.json/.jsonl/.parquet")
    study.add_argument("--text-column", default="text")
    study.add_argument("--label-column", default="label")
    study.add_argument("--steps", type=_positive_int, help="steps of each final trial")
    study.add_argument("--tune-steps", type=_positive_int, help="steps of each tune trial (default: the preset's)")
    study.add_argument("--lr-grid", type=_float_list, help="one lr grid for all, e.g. 1e-5,3e-5,1e-4 "
                                                          "(default: each optimizer's registry grid)")
    study.add_argument("--seeds", type=_int_list, help="final-stage seeds (default 0,1,2; smoke 0,1)")
    study.add_argument("--eval-every", type=_positive_int, help="final trials: eval-curve interval in steps")
    study.add_argument("--target", type=_finite_float, help="time-to-target threshold on the target metric "
                                                    "(default: the report derives one from the best final)")
    study.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    study.add_argument("--timeout", type=_positive_float, help="seconds per trial before it is killed")
    study.add_argument("--out", type=Path, help="results file (default: results/study-<preset>.jsonl); resumed")


def _study(args: argparse.Namespace) -> int:
    from optbench.study import run_study

    preset = PRESETS[args.preset]
    budget = STUDY_BUDGETS.get(args.preset) or StudyBudget(4, preset.steps, max(1, preset.steps // 6))
    names = []
    for name in args.optimizers:
        try:
            names.append(optimizers.resolve(name).name)
        except optimizers.UnknownOptimizerError as exc:
            raise UsageError(str(exc)) from None
    names = list(dict.fromkeys(names))
    if not names:
        raise UsageError("--optimizers is empty")
    missing = {n: r for n in names if (r := optimizers.resolve(n).unavailable_reason()) is not None}
    if missing:
        raise UsageError("; ".join(f"{n} is unavailable here: {r}" for n, r in missing.items()))
    steps, tune_steps = args.steps or preset.steps, args.tune_steps or budget.tune_steps
    if args.seeds is not None and not args.seeds:
        raise UsageError("--seeds is empty")
    seeds = args.seeds or list(budget.seeds)
    settings = dict(
        workload=args.workload or ("custom" if args.model else preset.workload), model=args.model,
        dataset=args.dataset, text_column=args.text_column, label_column=args.label_column, device=args.device,
        steps=steps, warmup_steps=min(preset.warmup_steps, steps // 2), batch_size=preset.batch_size,
        seq_len=preset.seq_len, eval_size=preset.eval_size, timeout_s=args.timeout or preset.timeout_s,
        eval_every=min(args.eval_every or budget.eval_every, steps), target=args.target, precision=args.precision,
    )
    out = args.out or Path("results") / f"study-{args.preset}.jsonl"
    if out.exists() and not out.is_file():
        raise UsageError(f"--out {out} is not a file")
    _check_inputs(build_grid(names[:1], seeds[:1], **settings)[0])
    grids = {name: sorted(args.lr_grid) for name in names} if args.lr_grid else None
    print(f"optbench: study of {', '.join(names)}: tune {tune_steps} steps x "
          f"{len(args.lr_grid) if args.lr_grid else budget.lr_points} lrs, then {steps} steps x seeds "
          f"{','.join(map(str, seeds))} -> {out}", file=sys.stderr)
    run_study(names, settings, lr_points=budget.lr_points, tune_steps=tune_steps,
              tune_warmup_steps=min(preset.warmup_steps, tune_steps // 2), seeds=seeds, out=out, grids=grids)
    _print_report([out], out_dir=None)
    return 0


def _run(args: argparse.Namespace) -> int:
    from optbench import scaling
    from optbench.results import Record, check_writable
    from optbench.runner import run_sweep

    if args.scale and (args.workload or args.model):
        raise UsageError("--scale sweeps the tiny BERT widths (workloads tiny-wN); drop --workload/--model")
    if args.widths and not args.scale:
        raise UsageError("--widths only applies with --scale")
    preset = scaling.SCALE_PRESET if args.scale else PRESETS[args.preset]
    names = optimizers.available_names() if [n.lower() for n in args.optimizers] == ["all"] else args.optimizers
    try:
        specs_optimizers = [optimizers.resolve(name).name for name in names]
        kwargs_by_optimizer = optimizers.parse_optimizer_kwargs(args.optimizer_kwargs)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not specs_optimizers:
        raise UsageError("--optimizers is empty")
    stray = sorted(set(kwargs_by_optimizer) - set(specs_optimizers))
    if stray:
        raise UsageError(f"--optimizer-kwargs for {', '.join(stray)}, which --optimizers does not run")
    steps = args.steps or preset.steps
    warmup = args.warmup_steps if args.warmup_steps is not None else min(preset.warmup_steps, steps // 2)
    if not 0 <= warmup < steps:
        raise UsageError(f"--warmup-steps must be in [0, steps), got {warmup} with {steps} steps")
    workload = args.workload or ("custom" if args.model else preset.workload)
    settings = dict(
        workload=workload, model=args.model, dataset=args.dataset, text_column=args.text_column,
        label_column=args.label_column, device=args.device, steps=steps, warmup_steps=warmup,
        batch_size=args.batch_size or preset.batch_size, seq_len=args.seq_len or preset.seq_len,
        eval_size=args.eval_size or preset.eval_size, lr=args.lr,
        timeout_s=args.timeout or preset.timeout_s, fidelity=args.fidelity, precision=args.precision,
        eval_every=args.eval_every or 0, target=args.target, max_memory_bytes=args.max_memory,
        **_parallel_settings(args),
    )
    seeds = args.seeds if args.seeds else list(preset.seeds)
    specs = [dataclasses.replace(spec, optimizer_kwargs=kwargs_by_optimizer.get(spec.optimizer, {}))
             for spec in build_grid(list(dict.fromkeys(specs_optimizers)), seeds, **settings)]
    if args.scale:
        try:
            specs = scaling.across_widths(specs, args.widths or scaling.SCALE_WIDTHS)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    _check_inputs(specs[0])
    out = args.out or (scaling.SCALE_OUT if args.scale else Path("results") / f"{args.preset}.jsonl")
    try:
        check_writable(out)
    except OSError as exc:
        raise UsageError(f"cannot write results to {out}: {exc.strerror or exc} (pass a writable file with --out)") \
            from None
    executor = _executor(args, specs, out)

    def show(record: Record) -> None:
        print(_summary_line(record), flush=True)

    runnable = []
    for spec in specs:
        reason = optimizers.resolve(spec.optimizer).unavailable_reason()
        if reason is None:
            runnable.append(spec)
        else:
            _record_unavailable(spec, reason, out, show)
    print(f"optbench: {len(specs)} trials -> {out}", file=sys.stderr)
    run_sweep(runnable, out, on_record=show, jobs=args.jobs, executor=executor)
    if args.scale:
        markdown, figure = scaling.write_scaling(_load_records([out]), out)
        print(markdown, end="")
        print(f"wrote {figure}", file=sys.stderr)
        return 0
    _print_report([out], out_dir=None)
    return 0


def _parallel_settings(args: argparse.Namespace) -> dict[str, object]:
    """engine, parallel and nproc for the specs; a parallel mode runs the native loop under torchrun."""
    if args.parallel == "none":
        if args.nproc not in (None, 1):
            raise UsageError("--nproc needs a --parallel mode (ddp, zero1 or fsdp2)")
        return {"engine": args.engine}
    if args.engine != "native":
        raise UsageError(f"--parallel {args.parallel} trains with the native loop; drop --engine {args.engine}")
    if args.fidelity:
        raise UsageError("--fidelity is single-process only; drop it or --parallel")
    nproc = args.nproc or 2
    if nproc < 2:
        raise UsageError(f"--parallel {args.parallel} needs --nproc 2 or more")
    return {"engine": "native", "parallel": args.parallel, "nproc": nproc}


def _executor(args: argparse.Namespace, specs: list, out: Path):
    """The executor `run` asked for; on CPU, --jobs > 1 comes with a warning about timings."""
    from optbench.executors import LocalExecutor, SubmititExecutor
    from optbench.runner import cuda_device_count
    from optbench.trial import resolve_device

    on_cpu = all(resolve_device(spec.device).type == "cpu" for spec in specs)
    if args.executor == "slurm":
        try:
            return SubmititExecutor(out.parent / "submitit", cluster="slurm")
        except ImportError:
            raise UsageError("--executor slurm needs submitit: pip install 'optbench[slurm]'") from None
        except RuntimeError as exc:  # submitit finds no slurm here
            raise UsageError(f"--executor slurm: {exc} (use --executor local)") from None
    if args.jobs > 1 and on_cpu:
        print(f"optbench: warning: {args.jobs} trials at once share this CPU's cores and memory bandwidth; their "
              "step times interfere (use --jobs 1 for timings you quote)", file=sys.stderr)
    elif args.jobs > cuda_device_count() > 0:
        print(f"optbench: warning: --jobs {args.jobs} but {cuda_device_count()} GPU(s): one trial per GPU at once",
              file=sys.stderr)
    uses_bitsandbytes = any(optimizers.resolve(s.optimizer).library.startswith("bitsandbytes") for s in specs)
    return LocalExecutor(preload_bitsandbytes=on_cpu and uses_bitsandbytes)


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


def _record_unavailable(spec, reason: str, out: Path, show) -> None:
    from optbench.results import append_record
    from optbench.trial import record_from_spec

    record = record_from_spec(spec)
    record.status, record.error = "skipped", f"unavailable here: {reason}"
    append_record(out, record)
    show(record)


def _summary_line(record) -> str:
    head = f"{record.optimizer:<12} seed={record.seed} {record.status:<8}"
    if record.status != "ok":
        return f"{head} {record.error or ''}"
    from optbench.results import MIB as mib

    memory = (f"peak CUDA {record.peak_cuda_allocated_bytes / mib:,.0f} MiB"
              if record.peak_cuda_allocated_bytes is not None
              else f"peak RSS {record.peak_rss_bytes / mib:,.0f} MiB (+{record.peak_rss_growth_bytes / mib:,.0f})")
    return (f"{head} state {record.state_bytes / mib:,.1f} MiB ({record.state_bytes_per_param:.3f} B/param), "
            f"{memory}, step {record.step_time_median_s * 1e3:,.0f} ms, {_headline(record)}"
            f" [{record.wall_s:.0f} s]")


def _headline(record) -> str:
    """The workload's target metric, from whichever split the trial was scored on."""
    metrics = record.val_metrics if record.stage == "tune" else record.eval_metrics
    value = metrics.get(record.target_metric)
    split = "val" if record.stage == "tune" else "eval"
    return f"{split} {record.target_metric} {value:.4g}" if value is not None else f"no {record.target_metric}"


def _load_records(files: list[Path]):
    from optbench.benchjson import BenchmarkJsonError, is_benchmark_path, read_benchmark_records
    from optbench.results import ResultsFileError, read_records

    records = []
    for path in files:
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                records.extend(read_benchmark_records(path) if is_benchmark_path(path) else read_records(path))
            for warning in caught:
                print(f"optbench: warning: {warning.message}", file=sys.stderr)
        except (ResultsFileError, BenchmarkJsonError, UnicodeDecodeError) as exc:
            raise UsageError(str(exc)) from None
    return records


def _print_report(files: list[Path], out_dir: Path | None, fmt: str = "md") -> None:
    from optbench.report import render_markdown, summarize, trials_frame, write_report

    records = _load_records(files)
    if not records:
        raise UsageError(f"no records in {', '.join(map(str, files))}")
    if out_dir is None:
        print(render_markdown(summarize(trials_frame(records))))
        return
    try:
        text, paths = write_report(records, out_dir, fmt=fmt)
    except OSError as exc:
        raise UsageError(f"cannot write the report into {out_dir}: {exc.strerror or exc}") from None
    print(text, end="" if text.endswith("\n") else "\n")
    print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)


def _report(args: argparse.Namespace) -> int:
    files = args.files or sorted(Path("results").glob("*.jsonl"))
    if not files:
        raise UsageError("no results files given and none in results/ (run `python -m optbench run` first)")
    _print_report(files, args.out_dir, args.format)
    return 0


def _with_overrides(limits: Thresholds, args: argparse.Namespace) -> Thresholds:
    """The calibrated thresholds with the ones given on the command line (compare's and nightly's flags)."""
    given = {"max_slowdown_pct": args.max_slowdown, "max_memory_growth_pct": args.max_memory_growth,
             "max_accuracy_drop_pts": args.max_accuracy_drop, "min_peak_growth_mib": args.min_peak_growth}
    return dataclasses.replace(limits, **{key: value for key, value in given.items() if value is not None})


def _compare(args: argparse.Namespace) -> int:
    from optbench import compare

    runs = {}
    for role, path in (("BASE", args.base), ("NEW", args.new)):
        runs[role] = _load_records([path])
        if not runs[role]:
            raise UsageError(f"no records in {role} {path}")
    calibrated = compare.calibrated_thresholds(runs["BASE"], runs["NEW"])
    limits = _with_overrides(calibrated, args)
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
        return 0
    print("Regressions:\n" + "\n".join(f"- {line}" for line in comparison.regressions))
    print(f"optbench: {len(comparison.regressions)} regression(s) beyond the thresholds", file=sys.stderr)
    return EXIT_REGRESSION


def _nightly(args: argparse.Namespace) -> int:

    from optbench import nightly

    names = []
    for name in args.optimizers or []:
        try:
            names.append(optimizers.resolve(name).name)
        except optimizers.UnknownOptimizerError as exc:
            raise UsageError(str(exc)) from None
    limits = _with_overrides(nightly.thresholds_for(args.device), args)
    config = nightly.NightConfig(device=args.device, preset=args.preset, baseline=args.baseline, out=args.out,
                                 thresholds=limits, optimizers=tuple(dict.fromkeys(names)), workload=args.workload,
                                 strict_env=args.strict_env, accept=args.accept)
    try:
        night = nightly.run_night(config)
    except nightly.NightlyError as exc:
        raise UsageError(str(exc)) from None
    print((args.out / "summary.md").read_text(encoding="utf-8"))
    if night.clean or args.accept:
        return 0
    print(f"optbench: {len(night.regressions)} regression(s); baseline kept", file=sys.stderr)
    return EXIT_REGRESSION


def _estimate(args: argparse.Namespace) -> int:
    from optbench import estimate

    if args.num_labels and args.params:
        raise UsageError("--num-labels needs --model (a --params count already includes any head)")
    try:
        size = (estimate.size_from_count(args.params) if args.params
                else estimate.size_from_model(args.model, args.num_labels))
    except estimate.EstimateError as exc:
        raise UsageError(str(exc)) from None
    measured = estimate.measured_bytes_per_param(_load_records([args.results])) if args.results else None
    print(estimate.render(estimate.estimate(size, measured, args.precision), size, args.gpus, args.gpu_memory))
    return 0


def _recommend(args: argparse.Namespace) -> int:
    """Exit 0 when something fits, 1 when nothing does (the answer says what to try)."""
    from optbench import estimate, recommend

    try:
        size = estimate.size_from_count(args.params) if args.params else estimate.size_from_model(args.model)
    except estimate.EstimateError as exc:
        raise UsageError(str(exc)) from None
    records = _load_records([args.results]) if args.results else []
    if args.results and not records:
        raise UsageError(f"no records in {args.results}")
    rows = recommend.recommend(size, args.gpu_memory, records, args.precision)
    print(recommend.render(rows, size, args.gpu_memory, args.precision, str(args.results) if args.results else None))
    return 0 if any(r.fits for r in rows) else 1


def _list(_: argparse.Namespace) -> int:
    from tabulate import tabulate

    rows = []
    for spec in optimizers.REGISTRY.values():
        reason = spec.unavailable_reason()
        low, high = spec.lr_range
        rows.append([spec.name, spec.hf_alias or "-", spec.precision, f"{spec.nominal_bytes_per_param:.3f}",
                     f"{spec.default_lr:g}", f"{low:g}-{high:g}", f'optbench[{spec.extra}]' if spec.extra else "core",
                     "yes" if reason is None else f"no: {reason}"])
    print(tabulate(rows, headers=["optimizer", "HF optim", "precision", "state B/param (1024x1024 fp32)",
                                  "default lr", "lr range", "install", "available here"], tablefmt="github"))
    print("\n" + optimizers.LIST_NOTES)
    return 0


COMMANDS = {"run": _run, "study": _study, "list": _list, "report": _report, "estimate": _estimate,
            "compare": _compare, "nightly": _nightly, "recommend": _recommend}


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or CI's cancel, `timeout`), taken down the same path as Ctrl-C: the running
    trial's process group is killed, what was recorded stays, and the exit status says which signal."""


def _terminate(signum: int, frame: object) -> NoReturn:
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread: leave signals to whoever owns it
        previous = None
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except UsageError as exc:
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
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
