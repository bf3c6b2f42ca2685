"""The command line's argument types: each turns bad input into one line (argparse's usage block would bury it),
saying what was expected and what was given.
"""

from __future__ import annotations

import argparse
import math
import warnings
from collections.abc import Callable, Hashable, Iterable


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


def _once_each(values: Iterable[Hashable], text: str) -> list:
    """The values in order, a repeat dropped and said (planner.once_each)."""
    from optbench.job.planner import once_each

    kept, repeated = once_each(list(values))
    if repeated:
        warnings.warn(f"'{text}' gives {', '.join(map(str, repeated))} more than once: each runs once", stacklevel=2)
    return kept


def int_list(text: str) -> list[int]:
    """Comma-separated integers, repeats dropped (order kept) and said, as `--optimizers` drops a name given
    twice."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None
    return _once_each(values, text)


SEED_LIMIT = 2**32  # numpy's legacy seeding, which HF's set_seed calls, takes 0 <= seed < 2**32


def seed_list(text: str) -> list[int]:
    """Comma-separated seeds, as `int_list`, each one every random generator a trial seeds accepts: a seed past
    int64 ended its trial `error` (torch's overflow) after the sweep had started."""
    seeds = int_list(text)
    outside = [seed for seed in seeds if not 0 <= seed < SEED_LIMIT]
    if outside:
        raise argparse.ArgumentTypeError(f"seeds are whole numbers from 0 to {SEED_LIMIT - 1}, got {outside[0]}")
    return seeds


def name_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def float_list(text: str) -> list[float]:
    """Comma-separated positive numbers (an lr grid), repeats dropped (order kept), as `int_list`."""
    values = _once_each((positive_float(part) for part in text.split(",") if part.strip()), text)
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive numbers, got '{text}'")
    return values


def param_count(text: str) -> int:
    from optbench.memory.estimate import EstimateError, parse_count

    try:
        return parse_count(text)
    except EstimateError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def memory_size(text: str) -> int:
    from optbench.memory.estimate import EstimateError, parse_bytes

    try:
        return parse_bytes(text)
    except EstimateError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


MANAGED_SBATCH = {"array": None, "output": None, "error": None, "open-mode": None, "signal": None, "wrap": None,
                  "time": "--slurm-time", "partition": "--slurm-partition", "account": "--slurm-account",
                  "gpus": "--gpus-per-trial", "gpus-per-node": "--gpus-per-trial", "gres": "--gpus-per-trial",
                  "gpus-per-task": "--gpus-per-trial"}


def sbatch_option(text: str) -> str:
    """`KEY=VALUE` or a bare `KEY` (a switch such as `exclusive`): checked, kept as typed (nightly passes it on)."""
    key = text.partition("=")[0].strip().lstrip("-")
    if not key or not all(c.isalnum() or c in "-_" for c in key):
        raise argparse.ArgumentTypeError(f"expected an sbatch option as KEY=VALUE (e.g. qos=high), got '{text}'")
    if key.replace("_", "-") in MANAGED_SBATCH:
        flag = MANAGED_SBATCH[key.replace("_", "-")]
        raise argparse.ArgumentTypeError(f"'{key}' is set by optbench" + (f": use {flag}" if flag else ""))
    return text


def gpu_request(text: str) -> str:
    """`N` or `TYPE:N` GPUs per trial (N >= 0), kept as typed."""
    kind, _, count = text.rpartition(":")
    if not (count.isascii() and count.isdigit()) or (kind and not all(c.isalnum() or c in "-_." for c in kind)):
        raise argparse.ArgumentTypeError(f"expected a GPU count, or TYPE:COUNT (e.g. a100:1), got '{text}'")
    return text
