"""The command line's parser: every command's flags and the job flags shared by run, study and nightly (the argument
types are argtypes.py's; the files named on it are read and checked by files.py).

Only parsing lives here; what the flags mean is optbench/job/planner.py's (job flags) and each command's.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import NoReturn

from optbench import optimizers
from optbench.cli.argtypes import (
    finite_float,
    float_list,
    gpu_request,
    int_list,
    memory_size,
    name_list,
    param_count,
    positive_float,
    positive_int,
    sbatch_option,
    seed_list,
    threshold,
)
from optbench.job.spec import PARALLEL_MODES, PARALLEL_NPROC, PRECISIONS, PRESETS, SCHEDULES
from optbench.trial.engines import ENGINES


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit code 2."""


# A value that starts with "-" and a digit is a value, not a flag, as in Python 3.13's argparse: on 3.11 only a
# plain number was, so `--gpu-memory -1GiB` said "expected one argument" instead of what is wrong with -1GiB.
# (No flag of ours looks like a negative number.)
NEGATIVE_VALUE = re.compile(r"-\.?\d")


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_VALUE

    def error(self, message: str) -> NoReturn:  # one line instead of argparse's usage block
        raise UsageError(message)


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that define the job and where it runs (planner.JOB_FLAGS): the same for run, study and nightly."""
    _add_job_definition(parser.add_argument_group("the job (defaults: the preset's)"))
    _add_placement(parser.add_argument_group("where it runs"))
    _add_slurm(parser.add_argument_group("on a Slurm cluster (--executor slurm; docs/cluster.md)"))


def _add_job_definition(job) -> None:
    job.add_argument("--workload", help="minilm (pretrained BERT classifier, default), lm (causal LM from scratch), "
                                        "tiny (random-init BERT, for tests) or custom (--model as a sequence "
                                        "classifier); see optbench.workloads")
    job.add_argument("--workload-option", action="append", metavar="KEY=VALUE",
                     help="a workload parameter, e.g. hidden_size=128 for tiny (repeatable)")
    job.add_argument("--model", help="HF model id or local folder, instead of the workload's model")
    job.add_argument("--dataset", help="HF dataset name[:config] or a local .csv/.json/.jsonl/.parquet")
    job.add_argument("--text-column", default="text")
    job.add_argument("--label-column", default="label")
    job.add_argument("--steps", type=positive_int)
    job.add_argument("--warmup-steps", type=int, help="steps kept out of the timing medians (and lr warm-up)")
    job.add_argument("--batch-size", type=positive_int)
    job.add_argument("--seq-len", type=positive_int)
    job.add_argument("--eval-size", type=positive_int)
    job.add_argument("--eval-every", type=positive_int,
                     help="evaluate a fixed eval subset every K steps (untimed): eval curve and time to target")
    job.add_argument("--target", type=finite_float,
                     help="time-to-target threshold on the workload's target metric (e.g. 0.9 accuracy)")
    job.add_argument("--lr", type=positive_float, help="one lr for all (default: each optimizer's own)")
    job.add_argument("--schedule", choices=SCHEDULES, default="linear",
                     help="lr after the warm-up: linear decay to 0 (HF Trainer's default), constant, cosine or wsd")
    job.add_argument("--precision", choices=PRECISIONS, default="fp32",
                     help="fp32 | bf16-autocast | fp16-autocast | bf16 (bf16 weights and grads, no fp32 master)")
    job.add_argument("--engine", choices=ENGINES, default="native",
                     help="training loop: native (optbench's own), trainer (HF Trainer) or accelerate")
    job.add_argument("--parallel", choices=("none", *PARALLEL_MODES), default="none",
                     help="data-parallel mode across --nproc processes (torchrun): ddp, zero1 (state sharded) or "
                          "fsdp2 (weights, grads and state sharded)")
    job.add_argument("--nproc", type=positive_int, help=f"processes (ranks) for --parallel (default {PARALLEL_NPROC})")
    job.add_argument("--optimizer-kwargs", action="append", default=[], metavar="NAME=JSON",
                     help="extra constructor kwargs for one optimizer, e.g. 'adamw8bit={\"betas\": [0.9, 0.95]}' "
                          "(repeatable)")
    job.add_argument("--fidelity", action="store_true",
                     help="also step a shadow fp32 AdamW; record update cosine / rel. error (inflates memory)")
    job.add_argument("--paired-probe", action="store_true",
                     help="time the stream kernel right after every optimizer step, over operands the size of the "
                          "model's weights: each step's bandwidth against the machine's at that moment (the record's "
                          "paired_roofline_fraction; native loop, one process; the operands add 4x the weights to "
                          "the process, outside the training-memory figures)")
    job.add_argument("--resume-check", action="store_true",
                     help="save a checkpoint at the middle step, resume in fresh objects, compare with the "
                          "uninterrupted run: checkpoint MiB, save/load s, resume status (native: torch.save, "
                          "--parallel: torch.distributed.checkpoint, --engine trainer: Trainer's own checkpoint)")


def _add_placement(where) -> None:
    where.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    where.add_argument("--timeout", type=positive_float, help="seconds per trial before it is killed")
    where.add_argument("--max-memory", type=memory_size, metavar="SIZE",
                       help="cap on the memory each trial adds (RLIMIT_AS; on CUDA the allocator's share of the "
                            "GPU), e.g. 8GiB: past it the trial is `oom`")
    where.add_argument("--jobs", type=positive_int,
                       help="trials at once: one GPU each on CUDA; on CPU the cores are shared, one thread share each "
                            "(default 1; a study: its design's, see optbench/job/presets.toml)")
    where.add_argument("--threads", type=positive_int, metavar="N",
                       help="torch's CPU threads in each trial (default: torch's own, all the cores this process may "
                            "use; with --jobs a share of them). On a shared VM a roofline repeats at 1 (README, "
                            "roofline %%), against a calibration at the same count (calibrate-bandwidth --threads)")
    where.add_argument("--executor", choices=["local", "slurm"], default="local",
                       help="local processes, or each round of trials as one Slurm job array (pip install submitit)")
    where.add_argument("--allow-errors", action="store_true",
                       help="exit 0 even when a trial ended `error` or `timeout` (default: exit 3)")


def _add_slurm(slurm) -> None:
    slurm.add_argument("--slurm-partition", metavar="NAME", help="the partition (default: the cluster's default)")
    slurm.add_argument("--slurm-time", type=positive_int, metavar="MINUTES",
                       help="each task's time limit (default: predicted from the same job's records, else the trial "
                            "timeout, plus 2 min)")
    slurm.add_argument("--gpus-per-trial", type=gpu_request, metavar="[TYPE:]N",
                       help="GPUs each trial asks for, e.g. 1 or a100:1 (default: --device cuda one per rank; auto "
                            "the same where the partition has GPUs, else none)")
    slurm.add_argument("--slurm-account", metavar="NAME", help="the account to charge")
    slurm.add_argument("--slurm-max-running", type=positive_int, metavar="N",
                       help="trials of an array running at once (the array's %%N; default: all)")
    slurm.add_argument("--slurm-pending-timeout", type=positive_float, metavar="SECONDS",
                       help="a task pending on a reason that waiting does not clear (partition down, held, ...) this "
                            "long is cancelled and recorded `timeout` (default 1800)")
    slurm.add_argument("--slurm-option", action="append", type=sbatch_option, metavar="KEY[=VALUE]",
                       help="any other sbatch option, e.g. qos=high, constraint=a100, mem=32G (repeatable)")


# sbatch options optbench sets itself, and the flag that sets each.
def add_optimizer_arguments(parser: argparse.ArgumentParser, preset_default: str, preset_help: str) -> None:
    parser.add_argument("--preset", choices=sorted(PRESETS), default=preset_default, help=preset_help)
    parser.add_argument("--optimizers", type=name_list,
                        help="comma-separated registry names or HF Trainer aliases (see `optbench list`), "
                             "or 'all' for every entry available here (default: the preset's, else "
                             f"{','.join(optimizers.DEFAULT_OPTIMIZERS)})")
    parser.add_argument("--seeds", type=seed_list, help="comma-separated seeds, e.g. 0,1,2")
    parser.add_argument("--out", type=Path, help="results file (default: results/<preset>.jsonl); resumed if present")
    parser.add_argument("--no-figures", action="store_true",
                        help="write the report's tables only, without the PNG figures (a few seconds faster)")
    parser.add_argument("--state-map", action="store_true",
                        help="also write each trial's measured per-parameter state map (CSV) beside the results, "
                             "in <out without .jsonl>/state-maps/")
    parser.add_argument("--margin", type=positive_float,
                        help="the difference that matters vs adamw: points for accuracy-like metrics (default 1), "
                             "%% for perplexity or loss (default 2); verdicts say equivalent, non-inferior, better, "
                             "worse or inconclusive against it")


def _add_peak_arguments(parser: argparse.ArgumentParser) -> None:
    """With a batch size and sequence length, estimate and recommend predict the peak (optbench.memory.predict)."""
    parser.add_argument("--batch-size", type=positive_int, help="with --seq-len and --model: predict the peak")
    parser.add_argument("--seq-len", type=positive_int, help="with --batch-size and --model: predict the peak")
    parser.add_argument("--device-kind", choices=["cuda", "cpu"], default="cuda",
                        help="what the peak is predicted for: CUDA allocated memory or CPU training memory")


def add_threshold_arguments(parser: argparse.ArgumentParser) -> None:
    """compare's and nightly's thresholds; unset: the device's calibrated values (docs/benchmarks.md)."""
    parser.add_argument("--max-slowdown", type=threshold, metavar="PCT",
                        help="step or optimizer-step time growth allowed, in %% (default: the device's calibrated "
                             "value; docs/benchmarks.md)")
    parser.add_argument("--max-memory-growth", type=threshold, metavar="PCT",
                        help="peak-memory or state growth allowed, in %% (default: calibrated)")
    parser.add_argument("--max-accuracy-drop", type=threshold, metavar="PTS",
                        help="drop allowed in an accuracy-like metric, in percentage points (default 1.0)")
    parser.add_argument("--max-metric-worsening", type=threshold, metavar="PCT",
                        help="worsening allowed in perplexity or loss, in %% (default 2)")
    parser.add_argument("--min-peak-growth", type=threshold, metavar="MIB",
                        help="a peak must also grow by more than this many MiB (default: 64 on CPU, its RSS "
                             "jitter; 0 on CUDA)")
    parser.add_argument("--strict-env", action="store_true",
                        help="refuse (exit 2) runs whose environments differ (machine, versions, threads) instead "
                             "of warning")


def job_argv(args: argparse.Namespace) -> list[str]:
    """The job flags of `args` that differ from their defaults, back as command-line words: what `nightly` hands
    to the `optbench run` it starts (one source for both: the parser's own actions)."""
    reference = Parser()
    add_job_arguments(reference)
    words: list[str] = []
    for action in reference._actions:
        if not action.option_strings or action.dest == "help":
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default or value is None:
            continue
        flag = action.option_strings[0]
        if action.nargs == 0:  # store_true
            words.append(flag)
        elif isinstance(value, list):  # append actions (the parsed values are the raw words)
            words += [word for item in value for word in (flag, str(item))]
        else:  # a memory size parsed to bytes goes back with its unit
            words += [flag, f"{value}B" if action.type is memory_size else str(value)]
    return words


# -- the commands ------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="optbench", description="Which optimizer fits my memory budget, at what cost?")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    run = commands.add_parser("run", help="run the fine-tuning job once per optimizer x seed")
    add_optimizer_arguments(run, "default", "job size (smoke: seconds per optimizer; default: ~1.5 min per "
                                                    "optimizer on CPU)")
    add_job_arguments(run)
    run.add_argument("--scale", action="store_true",
                     help="scaling sweep: tiny BERT at several widths, few steps; fits state bytes vs params "
                          "(default out: results/scaling.jsonl, writes scaling.png beside it)")
    run.add_argument("--widths", type=int_list, help="with --scale: hidden widths (default 32,64,128,256,512)")
    study = commands.add_parser("study", help="tune each optimizer's lr on a validation split, then compare them at "
                                              "their best lr over several seeds")
    add_optimizer_arguments(study, "study", "job size (study: ~30 min for 3 optimizers on 2 CPU cores; "
                                                    "smoke: <= 3 min)")
    add_job_arguments(study)
    study.add_argument("--lr-grid", type=float_list, help="one lr grid for all, e.g. 1e-5,3e-5,1e-4 "
                                                                  "(default: each optimizer's registry grid)")
    study.add_argument("--lr-points", type=positive_int, help="points of each registry grid")
    study.add_argument("--tune-seeds", type=seed_list, help="seeds of the tune stage (default 0)")
    study.add_argument("--tune-search", choices=["walk", "grid"],
                       help="walk: from the default lr, up then down while within the noise of the best (default); "
                            "grid: every point, all at once (parallel jobs, a full lr-sensitivity curve)")
    listing = commands.add_parser("list", help="registered optimizers: availability, precision, state bytes/param")
    listing.add_argument("--format", choices=["text", "markdown", "csv"], default="text",
                         help="text: a table that fits 120 columns, the reasons below it (default); markdown or csv: "
                              "every column, each entry's names, lr range, reason and description")
    _add_report_parser(commands)
    _add_compare_parsers(commands)
    _add_memory_parsers(commands)
    _add_bandwidth_parser(commands)
    return parser


def _add_bandwidth_parser(commands) -> None:
    calibrate = commands.add_parser("calibrate-bandwidth",
                                    help="measure this machine's memory bandwidth once (many passes of fused "
                                         "AdamW's update) into a per-machine file that every trial's roofline "
                                         "divides by")
    calibrate.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    calibrate.add_argument("--threads", type=positive_int,
                           help="torch threads to measure with (default: torch's; a CPU file is per thread count, "
                                "and trials find the one for theirs)")
    calibrate.add_argument("--rounds", type=positive_int, default=10,
                           help="rounds, each re-allocating its buffers (default 10)")
    calibrate.add_argument("--passes", type=positive_int, default=20,
                           help="timed passes per round (default 20; rounds x passes at least 20)")
    calibrate.add_argument("--keep-unsteady", action="store_true",
                           help="write the file even when the machine changed speed while it was measured (default: "
                                "refused, exit 2): for a check of whether a machine held its speed, where the "
                                "unsteadiness is the finding; no trial's roofline is shown against such a file")
    calibrate.add_argument("--out", type=Path,
                           help="write here instead of the cache ($OPTBENCH_CACHE or ~/.cache/optbench); trials then "
                                "need OPTBENCH_BANDWIDTH_FILE=PATH")


def _add_report_parser(commands) -> None:
    report = commands.add_parser("report", help="tabulate results files (default: results/*.jsonl)")
    report.add_argument("files", nargs="*", type=Path)
    report.add_argument("--out-dir", type=Path,
                        help="where report.md, summary.csv and the PNG figures go (default: one results file's "
                             "own folder, FILE without its suffix, where `run --out FILE` writes; several files: "
                             "results/; no FILE: the files results/*.jsonl holds, by the same rule)")
    report.add_argument("--format", choices=["md", "csv", "json", "html"], default="md",
                        help="what is printed (md default); html also writes report.html with the figures")
    report.add_argument("--margin", type=positive_float, help="the difference that matters (see run)")


def _add_compare_parsers(commands) -> None:
    compare = commands.add_parser("compare", help="BASE vs NEW per optimizer and job; exit 1 on a regression")
    for name in ("base", "new"):
        compare.add_argument(name, type=Path, help="results .jsonl, a folder of them (runs of one commit), "
                                                   "pytest-benchmark .json, or a folder of .json")
    compare.add_argument("--noise-history", type=Path, nargs="+", metavar="FILE",
                         help="results of earlier runs (same commit within a file's commit groups): their "
                              "run-to-run spread makes the time intervals where BASE or NEW has under 3 runs")
    add_threshold_arguments(compare)
    compare.add_argument("--export-github-benchmark", type=Path, metavar="FILE",
                         help="write NEW's numbers for github-action-benchmark: FILE (customSmallerIsBetter) and "
                              "FILE-accuracy (customBiggerIsBetter)")
    nightly = commands.add_parser("nightly", help="one night: benchmark suite, sweep, reports, compare with "
                                                  "BASELINE (rotated only when clean); exit 1 on a regression")
    nightly.add_argument("--preset", choices=["smoke", "nightly"], default="nightly",
                         help="size of the sweep and of the benchmark suite (default nightly)")
    nightly.add_argument("--baseline", type=Path,
                         help="folder with the last clean night; empty or absent: this night becomes it (required)")
    nightly.add_argument("--out", type=Path, help="folder for this night's results and summary.md (required)")
    nightly.add_argument("--print-baseline-key", action="store_true",
                         help="print what a baseline is valid for (GPU or CPU model, driver, torch) and exit; the "
                              "workflow keys its cached baseline by it")
    nightly.add_argument("--optimizers", type=name_list,
                         help="a subset (default: the sweep's set, the whole suite)")
    nightly.add_argument("--accept", action="store_true",
                         help="an intended change: report the comparison, then make this night the baseline")
    add_job_arguments(nightly)
    nightly.set_defaults(device=None)  # a night is a GPU night unless --device says otherwise (nightly_command)
    next(a for a in nightly._actions if a.dest == "device").help = "cuda (the default), cpu, auto or cuda:N"
    add_threshold_arguments(nightly)


def _add_model_size(parser: argparse.ArgumentParser) -> None:
    """The model `estimate` and `recommend` count: a parameter count, or a model's config (and a head); and the
    precision it trains in."""
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--params", type=param_count, help="parameter count: 65783042, 7e9 or 7B")
    size.add_argument("--model", help="local model folder or HF id: counted from its config on the meta device")
    parser.add_argument("--num-labels", type=positive_int,
                        help="with --model: add a sequence-classification head with this many classes")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="training precision: bf16 means 2-byte weights and grads (autocast keeps fp32 ones)")


def _add_memory_parsers(commands) -> None:
    estimate = commands.add_parser("estimate", help="weights + grads + optimizer state memory, before running")
    _add_model_size(estimate)
    estimate.add_argument("--results", type=Path, help="results file: use its measured state bytes/param")
    estimate.add_argument("--optimizers", type=name_list,
                          help="comma-separated registry names or HF Trainer aliases (default: every entry)")
    estimate.add_argument("--gpus", type=positive_int, default=1,
                          help="data-parallel GPUs; >1 adds ZeRO-1/2/3 columns")
    estimate.add_argument("--gpu-memory", type=memory_size, help="memory per GPU, e.g. 80GiB: what fits")
    _add_peak_arguments(estimate)
    recommend = commands.add_parser("recommend", help="which optimizers fit a memory budget, best trade-offs first")
    _add_model_size(recommend)
    recommend.add_argument("--gpu-memory", type=memory_size, required=True, help="memory per GPU, e.g. 24GiB")
    recommend.add_argument("--optimizers", type=name_list,
                           help="the ones to choose between: comma-separated registry names or HF Trainer aliases "
                                "(default: every entry)")
    recommend.add_argument("--results", type=Path,
                           help="results file: adds the activation overhead and accuracy measured there")
    _add_peak_arguments(recommend)
    fit = commands.add_parser("fit", help="the largest batch (or sequence) each optimizer fits in a memory budget: "
                                          "predicted, then confirmed by short trials; samples/s at that size")
    fit.add_argument("--memory", type=memory_size, required=True, metavar="SIZE", help="the budget, e.g. 1.5GiB")
    fit.add_argument("--optimizers", type=name_list, default=list(optimizers.DEFAULT_OPTIMIZERS))
    fit.add_argument("--grow", choices=["batch", "seq"], default="batch", help="what grows to fill the budget")
    fit.add_argument("--max-size", type=positive_int, help="the largest batch (or sequence length) to try")
    fit.add_argument("--repeats", type=positive_int, default=3,
                     help="trials per size, each a fresh process (default 3, at least 2): a size fits only when its "
                          "largest peak is under the budget by at least the spread its trials showed")
    fit.add_argument("--out", type=Path, default=Path("results") / "fit.jsonl",
                     help="the confirming trials' records (resumed); the table and figure go beside it")
    for flag, kind in (("--workload", str), ("--model", str), ("--batch-size", positive_int),
                       ("--seq-len", positive_int), ("--device", str)):
        fit.add_argument(flag, type=kind, help="the job (default: the MiniLM default job on CPU)")
    fit.add_argument("--precision", choices=PRECISIONS, help="the job's training precision")
    explain = commands.add_parser("explain", help="where an optimizer's state bytes go, parameter by parameter "
                                                  "(no training: the analytic map on a meta-device model)")
    explain.add_argument("optimizer", help="registry name or HF Trainer alias")
    explain.add_argument("--workload", help="whose model: minilm (default), lm, tiny or custom (--model's)")
    explain.add_argument("--model", help="local model folder or HF id (read offline from its config)")
    explain.add_argument("--parallel", choices=("none", *PARALLEL_MODES), default="none",
                         help="also each rank's state under this mode and every parameter whose state precision or "
                              "bytes per element differ from one process (predicted, no training)")
    explain.add_argument("--nproc", type=positive_int, help=f"ranks for --parallel (default {PARALLEL_NPROC})")
