"""Why the harness read faster than a bare loop: what each thing a trial does before its first timed step does to the
steps after it.

The harness-vs-bare check once found the harness 3-4 % *faster* than a bare loop doing nominally the same work
(pairs 0.950-1.034, median 0.959). Between its setup and its first timed step a trial does three things a bare loop
written from scratch does not: the bandwidth probe (then two buffers 2x the last-level cache, now buffers of the
working set the machine's calibration streams at the step's size: allocated, swept, freed, the heap trimmed), one
warm-up forward/backward, and the memory window's garbage collection and heap trim. Each can change the allocator's
state (glibc's mmap threshold rises as large blocks are freed, so later activations come from the heap instead of
fresh zeroed pages; a trim hands pages back), and so the steady-state step. This times, in one
process and single-threaded as the check, interleaved in a rotating order over ROUNDS rounds:

- `bare`: setup, then the loop (what the check's bare loop was);
- `+ bandwidth probe`, `+ warm-up pass`, `+ heap trim`: one part of the preamble each;
- `+ whole preamble`: all three, in the trial's order (what the check's bare loop is now);
- `harness`: the trial itself (optbench.trial.run.run_trial), its recorded step median.

Each variant's median step per round, and per variant its ratio to `bare` in the same round with the 95 % interval
over rounds (a Student-t interval on the log ratios): the part whose interval excludes 1 is what made the
difference.

    python scripts/harness_factors.py OUT.json [ROUNDS] [THREADS] [PRESET]   (PRESET smoke: the tiny BERT, quick)

On an idle machine at the default size: about 20 s per run, 6 runs a round; 8 rounds ≈ 16 minutes.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from bench_support import HARNESS_PREAMBLE, SIZES, bare_step_median_s, trial_spec  # noqa: E402

from optbench.records.environment import environment  # noqa: E402
from optbench.report import stats  # noqa: E402
from optbench.trial.run import run_trial  # noqa: E402

VARIANTS: dict[str, tuple[str, ...] | None] = {"bare": (), **{f"+ {part}": (part,) for part in HARNESS_PREAMBLE},
                                               "+ whole preamble": tuple(HARNESS_PREAMBLE), "harness": None}


def one_run(variant: str, spec, device: torch.device) -> float:
    preamble = VARIANTS[variant]
    if preamble is None:
        record = run_trial(spec)
        if record.status != "ok":
            raise RuntimeError(f"the harness run failed: {record.error}")
        return float(record.step_time_median_s)
    return bare_step_median_s(spec, device, preamble)


def ratio_interval(ratios: list[float]) -> dict[str, float | None]:
    interval = stats.mean_ci([math.log(r) for r in ratios])
    if interval is None or interval.half_width is None:
        return {"ratio": math.exp(interval.mean) if interval else None, "low": None, "high": None}
    return {"ratio": math.exp(interval.mean), "low": math.exp(interval.low), "high": math.exp(interval.high)}


def main(argv: list[str]) -> int:
    if not argv or not all(a.replace(".", "", 1).isdigit() for a in argv[1:3]):
        print("usage: python scripts/harness_factors.py OUT.json [ROUNDS] [THREADS] [PRESET]", file=sys.stderr)
        return 2
    out = Path(argv[0])
    rounds = int(argv[1]) if len(argv) > 1 else 8
    torch.set_num_threads(int(argv[2]) if len(argv) > 2 else 1)  # the check runs both sides single-threaded
    size = SIZES[argv[3] if len(argv) > 3 else "default"]
    device = torch.device("cpu")
    spec = trial_spec(size, "adamw", device, steps=size.overhead_steps, warmup_steps=size.overhead_warmup_steps,
                      eval_size=32)
    names = list(VARIANTS)
    medians: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        shift = index % len(names)  # each variant takes each place in the order in turn
        for name in names[shift:] + names[:shift]:
            medians[name].append(one_run(name, spec, device))
    result = {"rounds": rounds, "threads": torch.get_num_threads(), "step_median_s": medians,
              "ratio_to_bare": {name: ratio_interval([v / b for v, b in zip(medians[name], medians["bare"],
                                                                             strict=True)])
                                for name in names if name != "bare"},
              "env": environment(device)}
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["ratio_to_bare"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
