"""Does the host hold one speed across processes? The stream kernel (torch's fused AdamW update over the level the
trials' step divides by, optbench/probes/stream.py) run alone in several fresh processes, one after another: each
process's median pass, and whether they all lie within ±TOLERANCE of their median.

Why processes, not passes: on the AMD host the bracketed set's calibration was steady by its own rule (its passes in
one process), yet the five trials' own probes read 26.7-33.2 GB/s and their rooflines spread ±18.1 %: each process
kept a speed of its own. Five trials cannot agree within ±5 % on a host whose bare kernel moves by more than that
between processes, so the roofline-steady step runs its set only after this check finds the host steady, and runs
it again after the set to see whether the host stayed so.

    python scripts/steadiness_probe.py OUT.json [PROCESSES] [PASSES]

Exits 0 when steady, 3 when not; OUT.json keeps either verdict with the medians and the machine's stamp. Run it on
an idle machine (about 10 s a process).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from optbench.probes.stream import stream_bandwidth_samples  # noqa: E402
from optbench.records.environment import environment  # noqa: E402

# Half the ±5 % the trials must agree to: a host whose bare kernel strays further between processes leaves a trial
# (forward, backward and evaluation around the same kernel) no room to agree.
TOLERANCE = 0.025
PROCESSES, PASSES = 5, 30
NOT_STEADY_EXIT = 3


def stray(medians: list[float]) -> float:
    """The largest relative distance of one process's median from the median of all of them."""
    centre = statistics.median(medians)
    return max(abs(m / centre - 1) for m in medians)


def one_process(passes: int) -> float:
    """This process's median pass of the stream kernel, in bytes/s."""
    return statistics.median(stream_bandwidth_samples(torch.device("cpu"), samples=passes))


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "--one":
        print(one_process(int(argv[2])))
        return 0
    counts = argv[2:4]
    if not 2 <= len(argv) <= 4 or not all(c.isdigit() and int(c) >= 2 for c in counts):
        print("usage: python scripts/steadiness_probe.py OUT.json [PROCESSES] [PASSES]  (counts of at least 2)",
              file=sys.stderr)
        return 2
    out = Path(argv[1])
    processes, passes = [int(c) for c in counts] + [PROCESSES, PASSES][len(counts):]
    medians = [float(subprocess.run([sys.executable, __file__, "--one", str(passes)], check=True,
                                    capture_output=True, text=True).stdout)
               for _ in range(processes)]
    steady = stray(medians) <= TOLERANCE
    result = {"processes": processes, "passes": passes, "tolerance": TOLERANCE,
              "median_bytes_per_s": medians, "stray": stray(medians), "steady": steady,
              "env": environment(torch.device("cpu"))}
    out.write_text(json.dumps(result, indent=1) + "\n")
    gbs = ", ".join(f"{m / 1e9:.1f}" for m in medians)
    print(f"{processes} processes' stream-kernel medians {gbs} GB/s: within ±{100 * stray(medians):.1f} % of their "
          f"median, {'steady' if steady else 'NOT steady'} by the ±{100 * TOLERANCE:.1f} % rule", file=sys.stderr)
    return 0 if steady else NOT_STEADY_EXIT


if __name__ == "__main__":
    sys.exit(main(sys.argv))
