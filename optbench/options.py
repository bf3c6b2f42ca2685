"""The command line's parser: every command's flags, the job flags shared by run, study and nightly, and the
argument types that turn bad input into one line (argparse's usage block would bury it).

Only parsing lives here; what the flags mean is optbench/planner.py's (job flags) and each command's.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from optbench import optimizers
from optbench.engines import ENGINES
from optbench.engines.parallel import MODES as PARALLEL_MODES
from optbench.plan import PRECISIONS, PRESETS, SCHEDULES


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line instead of argparse's usage block
        raise UsageError(message)


def positive_int(text: str) -> int:
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


def positive_float(text: str) -> float:
    return _number(text, "a positive finite number", lambda v: 0 < v < math.inf)


def finite_float(text: str) -> float:
    return _number(text, "a finite number", math.isfinite)


def threshold(text: str) -> float:
    """A threshold: '10%', '10' and '10 %' all read as 10 (the unit is in the option's name)."""
    return _number(text.strip().removesuffix("%").strip(), "a finite number >= 0", lambda v: 0 <= v < math.inf)


def int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None


def name_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def float_list(text: str) -> list[float]:
    values = [positive_float(part) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive numbers, got '{text}'")
    return values


def param_count(text: str) -> int:
    from optbench.estimate import EstimateError, parse_count

    try:
        return parse_count(text)
    except EstimateError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def memory_size(text: str) -> int:
    from optbench.estimate import EstimateError, parse_bytes

    try:
        return parse_bytes(text)
    except EstimateError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that define the job and where it runs (planner.JOB_FLAGS): the same for run, study and nightly."""
    job = parser.add_argument_group("the job (defaults: the preset's)")
    job.add_argument("--workload", help="minilm (pretrained BERT classifier, default), lm (causal LM from scratch) "
                                        "or tiny (random-init BERT, for tests); see optbench.workloads")
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
    job.add_argument("--nproc", type=positive_int, help="processes (ranks) for --parallel (default 2)")
    job.add_argument("--optimizer-kwargs", action="append", default=[], metavar="NAME=JSON",
                     help="extra constructor kwargs for one optimizer, e.g. 'adamw8bit={\"betas\": [0.9, 0.95]}' "
                          "(repeatable)")
    job.add_argument("--fidelity", action="store_true",
                     help="also step a shadow fp32 AdamW; record update cosine / rel. error (inflates memory)")
    job.add_argument("--resume-check", action="store_true",
                     help="save a checkpoint at the middle step, resume in fresh objects, compare with the "
                          "uninterrupted run: checkpoint MiB, save/load s, resume status")
    where = parser.add_argument_group("where it runs")
    where.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    where.add_argument("--timeout", type=positive_float, help="seconds per trial before it is killed")
    where.add_argument("--max-memory", type=memory_size, metavar="SIZE",
                       help="cap on the memory each trial adds (RLIMIT_AS; on CUDA the allocator's share of the "
                            "GPU), e.g. 8GiB: past it the trial is `oom`")
    where.add_argument("--jobs", type=positive_int, default=1,
                       help="trials at once: one GPU each on CUDA; on CPU the cores are shared (timings interfere)")
    where.add_argument("--executor", choices=["local", "slurm"], default="local",
                       help="local processes, or one slurm job per trial through submitit (pip install submitit)")
    where.add_argument("--allow-errors", action="store_true",
                       help="exit 0 even when a trial ended `error` or `timeout` (default: exit 3)")


def add_optimizer_arguments(parser: argparse.ArgumentParser, preset_default: str, preset_help: str) -> None:
    parser.add_argument("--preset", choices=sorted(PRESETS), default=preset_default, help=preset_help)
    parser.add_argument("--optimizers", type=name_list, default=list(optimizers.DEFAULT_OPTIMIZERS),
                        help="comma-separated registry names or HF Trainer aliases (see `optbench list`), "
                             "or 'all' for every entry available here")
    parser.add_argument("--seeds", type=int_list, help="comma-separated seeds, e.g. 0,1,2")
    parser.add_argument("--out", type=Path, help="results file (default: results/<preset>.jsonl); resumed if present")
    parser.add_argument("--state-map", action="store_true",
                        help="also write each trial's measured per-parameter state map (CSV) beside the results, "
                             "in <out without .jsonl>/state-maps/")
    parser.add_argument("--margin", type=positive_float,
                        help="the difference that matters vs adamw: points for accuracy-like metrics (default 1), "
                             "%% for perplexity or loss (default 2); verdicts say equivalent, non-inferior, better, "
                             "worse or inconclusive against it")


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
