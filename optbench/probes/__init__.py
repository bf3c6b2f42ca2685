"""Measuring instruments, each written once: optimizer-state bytes and peak memory (`measure.py`), step and
optimizer-step timing (`timing.py`), update fidelity against an fp32 shadow AdamW (`fidelity.py`), device
bandwidth (the stream probe in `stream.py`; the machine's calibration, measured once, in `bandwidth.py`). The
trial, the HF Trainer callback and the benchmark suite all measure through these. A probe that cannot measure as
it should says so (`measure.MeasurementWarning`). `slowdown.py` is a test-only knob, reached by production code
through one seam (`Setup.install_optimizer`).

Adding a probe: a function or class here that takes torch objects and returns numbers; the record field that
holds it in optbench/records/record.py.

May import: nothing else of optbench (torch only).
"""

import os
from pathlib import Path

CACHE_ENV = "OPTBENCH_CACHE"  # the user's cache folder: bandwidth/ and calibrations/ below it


def cache_dir() -> Path:
    """Where optbench keeps per-machine files (the bandwidth calibration, the user's memory calibration):
    $OPTBENCH_CACHE, else $XDG_CACHE_HOME/optbench, else ~/.cache/optbench; a leading ~ is expanded. Torch-free: the
    memory predictor reads its calibration without loading torch."""
    given = os.environ.get(CACHE_ENV)
    cache = Path(given) if given else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "optbench"
    return cache.expanduser()


# `optimizer_impl` of a step that calls torch.cuda.synchronize() after every parameter (bitsandbytes'
# Optimizer8bit.step): the host waits out each kernel before it launches the next, so the step is host-serialised
# and its roofline share is bound by launches and waits. Here, torch-free, so that the report can name it.
HOST_SYNCED = "per-parameter, host-synced"

# A bandwidth calibration is steady when its slowest passes (the 5 % quantile) ran at STEADY_SHARE of its fastest
# (the 95 %, the ceiling) or more. On the 2-core reference CPU at rest 200 passes spread 24.2-29.4 GB/s (82 %); one
# taken while the host was slowed spread 7.6-15.5 (49 %), and five fused-AdamW trials divided by it read 98-173 %
# "of the roofline". A machine whose speed moved while it was measured has no one ceiling: such a calibration is
# not written (cli/bandwidth.py) and a record stamped with one shows no roofline (report/metrics.py).
STEADY_SHARE = 0.7


def steady_calibration(ceiling_bytes_per_s: float, spread_bytes_per_s: float) -> bool:
    """Whether a calibration's 5-95 % spread (`spread`, the ceiling being its 95 % quantile) leaves its slowest
    passes at STEADY_SHARE of the ceiling or more. Torch-free: the report judges stamped records with it."""
    return ceiling_bytes_per_s > 0 and ceiling_bytes_per_s - spread_bytes_per_s >= STEADY_SHARE * ceiling_bytes_per_s
