"""The device's achievable memory bandwidth, measured once per machine and kept outside the package.

A ceiling measured inside each trial on a shared machine is noise: per-trial triad medians ranged 12.6-56.6 GB/s
across one machine's records, and the same fused AdamW kernel read 79-109 % "of the roofline" in four trials.
`calibrate` runs the trial probe's own kernel (an in-place triad `a += s * b`, triad.triad_bandwidth_samples)
for many passes after a warm-up round and keeps a high quantile as the ceiling, with the quantiles that show its
spread. `save` writes it to a per-machine file in the user's cache — `$OPTBENCH_CACHE`, else
`$XDG_CACHE_HOME/optbench`, else `~/.cache/optbench` — named by the device (CPU model, or GPU name) and torch's
thread count, since a CPU's reachable bandwidth depends on how many threads stream; `$OPTBENCH_BANDWIDTH_FILE`
names a file instead. Never inside the installed package.

Every trial stamps the calibration it found (`describe_bandwidth`): the ceiling, its spread and its source, or
"uncalibrated", and the roofline divides by the ceiling only (none without a calibration). The trial's own short
probe stays on the record as a check: outside the calibration's 5-95 % range it is flagged as disagreeing (the
machine was busier, or other, than when it was calibrated).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from optbench.probes import STEADY_SHARE, measure, steady_calibration, triad

CACHE_ENV = "OPTBENCH_CACHE"
FILE_ENV = "OPTBENCH_BANDWIDTH_FILE"
UNCALIBRATED = "uncalibrated"
CEILING_QUANTILE = 0.95  # the ceiling: passes a neighbour slowed sit below it, the machine's own best near it
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
ROUNDS, PASSES = 10, 20  # 200 timed passes; each round re-allocates and pages in its buffers, then warms the kernel


class BandwidthError(ValueError):
    """A calibration file that cannot be read; the message names it."""


@dataclass(frozen=True)
class BandwidthCalibration:
    """One machine's triad bandwidth over many passes: the ceiling a roofline divides by, and its spread."""

    machine: str  # the key the file is found by: device kind, name, model, threads
    device_name: str
    threads: int
    ceiling_bytes_per_s: float  # the CEILING_QUANTILE of the passes
    quantiles_bytes_per_s: dict[str, float]  # "0.05" ... "0.95"
    passes: int
    buffer_bytes: int  # per operand
    measured_at: str = ""
    env: dict[str, Any] = field(default_factory=dict)  # the environment stamp: commit, load while measuring

    @property
    def spread_bytes_per_s(self) -> float:
        """The 5-95 % range of the passes."""
        return self.quantiles_bytes_per_s["0.95"] - self.quantiles_bytes_per_s["0.05"]

    @property
    def steady(self) -> bool:
        """Whether the machine held one speed while it was measured (probes.steady_calibration)."""
        return steady_calibration(self.ceiling_bytes_per_s, self.spread_bytes_per_s)

    def disagrees(self, probe_bytes_per_s: float) -> bool:
        """A trial probe's median outside the calibration's 5-95 % range: the machine then was not the machine
        calibrated (busier, other threads, another device)."""
        q = self.quantiles_bytes_per_s
        return not q["0.05"] <= probe_bytes_per_s <= q["0.95"]

    def describe(self) -> str:
        q = self.quantiles_bytes_per_s
        return (f"{self.machine}: ceiling {self.ceiling_bytes_per_s / 1e9:.1f} GB/s (the {CEILING_QUANTILE:.0%} "
                f"quantile of {self.passes} triad passes; 5-95 % {q['0.05'] / 1e9:.1f}-{q['0.95'] / 1e9:.1f} GB/s, "
                f"median {q['0.5'] / 1e9:.1f})" + ("" if self.steady else
                f"; unsteady: its slowest passes ran at {q['0.05'] / q['0.95']:.0%} of its fastest (a steady machine's "
                f">= {STEADY_SHARE:.0%}): the machine changed speed while it was measured"))


def cache_dir() -> Path:
    """Where optbench keeps per-machine files: $OPTBENCH_CACHE, else $XDG_CACHE_HOME/optbench, ~/.cache/optbench."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "optbench"


def default_path(machine: str) -> Path:
    """$OPTBENCH_BANDWIDTH_FILE, else the machine's file in the cache (`machine`: environment.machine_key)."""
    given = os.environ.get(FILE_ENV)
    return Path(given) if given else cache_dir() / "bandwidth" / f"{machine}.json"


def calibrate(device: torch.device, machine: str, device_name: str, env: dict[str, Any], rounds: int = ROUNDS,
              passes: int = PASSES) -> BandwidthCalibration:
    """Many triad passes on `device` with torch's current threads, after one untimed round that warms the kernel
    and the allocator: the ceiling and the quantiles of their spread. `machine`, `device_name` and `env` say what
    was measured (the caller's environment stamp)."""
    import numpy as np

    triad.triad_bandwidth_samples(device, passes)  # warm-up round, discarded
    rates = [rate for _ in range(rounds) for rate in triad.triad_bandwidth_samples(device, passes)]
    if not rates:
        raise BandwidthError(f"no bandwidth could be measured on {device}: too little free memory for the buffers")
    values = np.quantile(rates, [CEILING_QUANTILE, *QUANTILES])
    return BandwidthCalibration(
        machine=machine, device_name=device_name, threads=torch.get_num_threads(),
        ceiling_bytes_per_s=float(values[0]), quantiles_bytes_per_s={f"{q:g}": float(v)
                                                                     for q, v in zip(QUANTILES, values[1:],
                                                                                     strict=True)},
        passes=len(rates), buffer_bytes=triad.bandwidth_buffer_bytes(device),
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), env=env)


def save(calibration: BandwidthCalibration, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(calibration), indent=1) + "\n", encoding="utf-8")
    return path


def read(path: Path) -> BandwidthCalibration:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        data["quantiles_bytes_per_s"] = {str(k): float(v) for k, v in data["quantiles_bytes_per_s"].items()}
        return BandwidthCalibration(**data)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise BandwidthError(f"{path}: not a bandwidth calibration ({exc})") from None


def load_for(machine: str) -> tuple[BandwidthCalibration | None, str]:
    """(the calibration of `machine` — environment.machine_key: the device and torch's threads —, where it came
    from); (None, why not) when there is no file, it is unreadable, or it belongs to another machine."""
    path = default_path(machine)
    if not path.is_file():
        return None, f"{UNCALIBRATED}: no {path} (run `python -m optbench calibrate-bandwidth`)"
    try:
        found = read(path)
    except BandwidthError as exc:
        return None, f"{UNCALIBRATED}: {exc}"
    if found.machine != machine:
        return None, f"{UNCALIBRATED}: {path} is for {found.machine}, this is {machine}"
    return found, str(path)


def describe_bandwidth(record: Any, probe_samples: list[float], calibration: BandwidthCalibration | None,
                       source: str) -> None:
    """The record's bandwidth figures: the trial's own probe (median, IQR), the calibrated ceiling the roofline
    divides by (with its spread and source, or the reason there is none) and whether the probe disagreed."""
    record.device_bandwidth_bytes_per_s, record.device_bandwidth_iqr_bytes_per_s = measure.median_iqr(probe_samples)
    record.device_bandwidth_source = source
    if calibration is None:
        return
    record.device_bandwidth_calibrated_bytes_per_s = calibration.ceiling_bytes_per_s
    record.device_bandwidth_calibrated_spread_bytes_per_s = calibration.spread_bytes_per_s
    if record.device_bandwidth_bytes_per_s is not None:
        record.device_bandwidth_probe_disagrees = calibration.disagrees(record.device_bandwidth_bytes_per_s)
