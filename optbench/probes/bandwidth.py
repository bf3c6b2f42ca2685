"""The device's achievable memory bandwidth, measured once per machine and kept outside the package.

A ceiling measured inside each trial on a shared machine is noise: per-trial triad medians ranged 12.6-56.6 GB/s
across one machine's records, and the same fused AdamW kernel read 79-109 % "of the roofline" in four trials.
`calibrate` runs the trial probe's own kernel (torch's fused AdamW update over four operands,
stream.stream_bandwidth_samples: a ceiling must be one the widest step cannot beat, and fused AdamW beat a triad)
for many passes after a warm-up round and keeps a high quantile as the ceiling, with the quantiles that show its
spread, at several **working sets**: the probe's own (four operands of the last-level cache: memory), and halving
down to an eighth of the cache. What a step can stream may depend on where its data lives: a model whose weights,
gradients and state fit in a last-level cache that is really its own steps at the cache's speed. A trial's
roofline divides by the ceiling of the largest working set calibrated that is no larger than its step's own
(`level_for`: weights + grads + state): the most the cache could have given it, so the share is never flattered.
(On the 2-core hosts here, which report 480 MiB of L3 shared with other guests, the levels down to 240 MiB read
about the memory's speed: two calibrations ten minutes apart put the 240 MiB level at 47.0 and 42.1 GB/s, the
memory at 43.1 and 43.2; the smaller levels were mostly unsteady.)
`save` writes it to a per-machine file in the user's cache — `$OPTBENCH_CACHE`, else `$XDG_CACHE_HOME/optbench`,
else `~/.cache/optbench` — named by the device (CPU model, or GPU name) and torch's thread count, since a CPU's
reachable bandwidth depends on how many threads stream; `$OPTBENCH_BANDWIDTH_FILE` names a file instead. Never
inside the installed package. A file measured with another kernel (the triad, before) is not used: its ceiling is
not this probe's, and the trial's probe could not check it.

Every trial stamps the calibration it found (`describe_bandwidth`): the ceiling its working set divides by, that
level's spread and working set, the kernel and its source, or "uncalibrated", and the roofline divides by the
ceiling only (none without a calibration). The trial's own short probe streams the same level
(`probe_operand_bytes`; without a calibration, operands of the step's own size) and stays on the record as a
check: outside that level's 5-95 % range it is flagged as disagreeing (the machine was busier, or other, than
when it was calibrated), and above the ceiling the trial warns that the calibration is stale (a calibration from
a slower day read a trial's probe at 50.9 GB/s against its 42.1 GB/s ceiling, and its roofline at 1.026).
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from optbench.probes import STEADY_SHARE, cache_dir, measure, steady_calibration, stream

FILE_ENV = "OPTBENCH_BANDWIDTH_FILE"
UNCALIBRATED = "uncalibrated"
TRIAD = "triad"  # the kernel calibrations were measured with before stream.KERNEL: `a += s * b`, two operands
CEILING_QUANTILE = 0.95  # the ceiling: passes a neighbour slowed sit below it, the machine's own best near it
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
ROUNDS, PASSES = 10, 20  # 200 timed passes; each round re-allocates and pages in its buffers, then warms the kernel
MIN_PASSES = 20  # fewer, and the 5 % and 95 % quantiles are the slowest and fastest pass themselves, not a spread
LEVELS = 6  # working sets calibrated: the probe's own, then halving five times (4x down to 1/8 of a CPU's cache)


class BandwidthError(ValueError):
    """A calibration file that cannot be read; the message names it."""


@dataclass(frozen=True)
class BandwidthLevel:
    """The probe kernel's bandwidth at one working set (all its operands), over many passes: its ceiling and
    spread."""

    working_set_bytes: int
    ceiling_bytes_per_s: float  # the CEILING_QUANTILE of the passes
    quantiles_bytes_per_s: dict[str, float]  # "0.05" ... "0.95"
    passes: int

    @property
    def spread_bytes_per_s(self) -> float:
        return self.quantiles_bytes_per_s["0.95"] - self.quantiles_bytes_per_s["0.05"]

    @property
    def steady(self) -> bool:
        return steady_calibration(self.ceiling_bytes_per_s, self.spread_bytes_per_s)

    def disagrees(self, probe_bytes_per_s: float) -> bool:
        """A trial probe's median outside this level's 5-95 % range: the machine then was not the machine
        calibrated (busier, other threads, another device)."""
        q = self.quantiles_bytes_per_s
        return not q["0.05"] <= probe_bytes_per_s <= q["0.95"]


@dataclass(frozen=True)
class BandwidthCalibration:
    """One machine's bandwidth over many passes of the probe kernel: the ceiling a roofline divides by, and its
    spread. The top-level figures are the memory level's (the working set the trial probe streams); `levels` adds
    the smaller working sets, largest first (files from before them hold the memory level alone)."""

    machine: str  # the key the file is found by: device kind, name, model, threads
    device_name: str
    threads: int
    ceiling_bytes_per_s: float  # the CEILING_QUANTILE of the passes
    quantiles_bytes_per_s: dict[str, float]  # "0.05" ... "0.95"
    passes: int
    buffer_bytes: int  # per operand
    measured_at: str = ""
    env: dict[str, Any] = field(default_factory=dict)  # the environment stamp: commit, load while measuring
    levels: tuple[BandwidthLevel, ...] = ()
    # smaller working sets measured but left out: unsteady (a shared cache's speed moves with its neighbours); kept
    # here, as measured, so the file says why a step of that size divides by a larger level's ceiling
    unsteady_levels: tuple[BandwidthLevel, ...] = ()
    kernel: str = TRIAD  # the probe kernel it was measured with (stream.KERNEL); files without the field: the triad

    @property
    def operands(self) -> int:
        """How many operands of `buffer_bytes` one of its passes streams: its working set per operand."""
        return stream.OPERANDS if self.kernel == stream.KERNEL else 2

    def level_for(self, working_set_bytes: int | None) -> BandwidthLevel:
        """The level a step whose data spans `working_set_bytes` divides by: the largest calibrated working set no
        larger than it (the smallest level, for a step smaller still; the memory level when the size is unknown)."""
        levels = sorted(self.levels or (self.memory_level,), key=lambda level: level.working_set_bytes)
        if working_set_bytes is None:
            return levels[-1]
        fitting = [level for level in levels if level.working_set_bytes <= working_set_bytes]
        return fitting[-1] if fitting else levels[0]

    @property
    def memory_level(self) -> BandwidthLevel:
        return BandwidthLevel(self.operands * self.buffer_bytes, self.ceiling_bytes_per_s, self.quantiles_bytes_per_s,
                              self.passes)

    @property
    def spread_bytes_per_s(self) -> float:
        """The 5-95 % range of the passes."""
        return self.quantiles_bytes_per_s["0.95"] - self.quantiles_bytes_per_s["0.05"]

    @property
    def steady(self) -> bool:
        """Whether the machine held one speed while the memory level was measured (probes.steady_calibration): the
        ceiling every other level falls back to. A smaller level that was not steady is left out (`unsteady_levels`)."""
        return self.memory_level.steady and all(level.steady for level in self.levels)

    def describe(self) -> str:
        lines = [f"{self.machine}: the {CEILING_QUANTILE:.0%} quantile of the {self.kernel} kernel's passes per "
                 f"working set ({self.operands} operands):"]
        shown = (*(self.levels or (self.memory_level,)), *self.unsteady_levels)
        for level in sorted(shown, key=lambda lv: -lv.working_set_bytes):
            q = {key: value / 1e9 for key, value in level.quantiles_bytes_per_s.items()}
            line = (f"  {level.working_set_bytes / 2**20:8,.0f} MiB: ceiling {level.ceiling_bytes_per_s / 1e9:.1f} "
                    f"GB/s ({level.passes} passes; 5-95 % {q['0.05']:.1f}-{q['0.95']:.1f} GB/s, median {q['0.5']:.1f})")
            if not level.steady:
                line += (f"; unsteady: its slowest passes ran at {q['0.05'] / q['0.95']:.0%} of its fastest (a steady "
                         f"machine's >= {STEADY_SHARE:.0%}): the machine changed speed while it was measured")
                line += "; left out" if level in self.unsteady_levels else ""
            lines.append(line)
        return "\n".join(lines)


def default_path(machine: str) -> Path:
    """$OPTBENCH_BANDWIDTH_FILE, else the machine's file in the cache (`machine`: environment.machine_key)."""
    given = os.environ.get(FILE_ENV)
    return Path(given) if given else cache_dir() / "bandwidth" / f"{machine}.json"


def level_operand_bytes(memory_operand_bytes: int, levels: int = LEVELS) -> list[int]:
    """The operand sizes calibrated, largest first: the probe's own, then halving `levels - 1` times (on a CPU from
    the last-level cache down to a thirty-second of it, so every working set from deep inside the cache to far
    past it has a level)."""
    return [max(1, memory_operand_bytes >> k) for k in range(levels)]


def measure_level(device: torch.device, operand_bytes: int, rounds: int, passes: int) -> BandwidthLevel | None:
    """Many passes of the probe kernel over operands of `operand_bytes`, after one untimed round that warms the
    kernel and the allocator; None where the device has no room for them."""
    import numpy as np

    stream.stream_bandwidth_samples(device, passes, operand_bytes)  # warm-up round, discarded
    rates = [rate for _ in range(rounds) for rate in stream.stream_bandwidth_samples(device, passes, operand_bytes)]
    if not rates:
        return None
    values = np.quantile(rates, [CEILING_QUANTILE, *QUANTILES])
    return BandwidthLevel(working_set_bytes=stream.OPERANDS * operand_bytes, ceiling_bytes_per_s=float(values[0]),
                          quantiles_bytes_per_s={f"{q:g}": float(v) for q, v in zip(QUANTILES, values[1:],
                                                                                    strict=True)},
                          passes=len(rates))


def check_passes(rounds: int, passes: int) -> None:
    """A calibration's spread is its 5-95 % range: it needs MIN_PASSES timed passes in all (rounds x passes) to
    mean one. Raises BandwidthError before anything is measured."""
    if rounds * passes < MIN_PASSES:
        raise BandwidthError(f"--rounds {rounds} x --passes {passes} is {rounds * passes} timed passes; a "
                             f"calibration needs at least {MIN_PASSES} for its 5-95 % range to be a spread, not the "
                             "slowest and fastest pass")


def calibrate(device: torch.device, machine: str, device_name: str, env: dict[str, Any], rounds: int = ROUNDS,
              passes: int = PASSES, levels: int = LEVELS) -> BandwidthCalibration:
    """Many passes of the probe kernel on `device` with torch's current threads at each working set
    (level_operand_bytes): the ceilings and the quantiles of their spread. `machine`, `device_name` and `env` say
    what was measured (the caller's environment stamp)."""
    room = stream.cuda_room_bytes(device) if device.type == "cuda" else None
    memory_operand = stream.bandwidth_buffer_bytes(device, room)
    measured = [measure_level(device, size, rounds, passes) for size in level_operand_bytes(memory_operand, levels)]
    found = tuple(level for level in measured if level is not None)
    if not found or measured[0] is None:
        raise BandwidthError(f"no bandwidth could be measured on {device}: too little free memory for the buffers")
    memory = found[0]
    kept = (memory, *(level for level in found[1:] if level.steady))
    return BandwidthCalibration(
        machine=machine, device_name=device_name, threads=torch.get_num_threads(),
        ceiling_bytes_per_s=memory.ceiling_bytes_per_s, quantiles_bytes_per_s=memory.quantiles_bytes_per_s,
        passes=memory.passes, buffer_bytes=memory_operand, kernel=stream.KERNEL,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), env=env, levels=kept,
        unsteady_levels=tuple(level for level in found[1:] if not level.steady))


MIN_PROBE_OPERAND_BYTES = 2**20  # a trial probe's operands at least (a tiny model's working set sits in L2)


def probe_operand_bytes(device: torch.device, working_set_bytes: int | None,
                        calibration: BandwidthCalibration | None) -> int:
    """The operand size a trial's own probe streams: the calibrated level its step divides by (`level_for`), so the
    probe checks the ceiling its roofline uses; uncalibrated, a quarter of the step's working set (one operand of
    four), between 1 MiB (16 MiB on CUDA) and the memory level's operands. A step's data, not the memory level's:
    on a host with a 480 MiB cache the memory-level probe allocated 1.9 GB and took 1.8 s a call on one thread,
    twice per trial."""
    floor = stream.MIN_CUDA_BANDWIDTH_OPERAND_BYTES if device.type == "cuda" else MIN_PROBE_OPERAND_BYTES
    if calibration is not None:
        return max(floor, calibration.level_for(working_set_bytes).working_set_bytes // calibration.operands)
    room = stream.cuda_room_bytes(device) if device.type == "cuda" else None
    memory = stream.bandwidth_buffer_bytes(device, room)
    if working_set_bytes is None:
        return memory
    return max(min(floor, memory), min(memory, working_set_bytes // stream.OPERANDS))


def save(calibration: BandwidthCalibration, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(calibration), indent=1) + "\n", encoding="utf-8")
    return path


def read(path: Path) -> BandwidthCalibration:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        data["quantiles_bytes_per_s"] = _quantiles(data["quantiles_bytes_per_s"])
        for key in ("levels", "unsteady_levels"):
            data[key] = tuple(BandwidthLevel(**{**level, "quantiles_bytes_per_s":
                                                _quantiles(level["quantiles_bytes_per_s"])})
                              for level in data.get(key, ()))
        return BandwidthCalibration(**data)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise BandwidthError(f"{path}: not a bandwidth calibration ({exc})") from None


def _quantiles(raw: dict[str, Any]) -> dict[str, float]:
    return {str(k): float(v) for k, v in raw.items()}


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
    if found.kernel != stream.KERNEL:
        return None, (f"{UNCALIBRATED}: {path} was measured with the {found.kernel} kernel, the probe now runs "
                      f"{stream.KERNEL} (run `python -m optbench calibrate-bandwidth` again)")
    return found, str(path)


def describe_bandwidth(record: Any, probe_samples: list[float], calibration: BandwidthCalibration | None,
                       source: str, working_set_bytes: int | None = None) -> None:
    """The record's bandwidth figures: the trial's own probe (median, IQR), the calibrated ceiling the roofline
    divides by — the level of the step's working set (`level_for`), with its spread, working set and source, or
    the reason there is none — and whether the probe (which streams that level: probe_operand_bytes) disagreed."""
    record.device_bandwidth_bytes_per_s, record.device_bandwidth_iqr_bytes_per_s = measure.median_iqr(probe_samples)
    record.device_bandwidth_source = source
    if calibration is None:
        return
    level = calibration.level_for(working_set_bytes)
    record.device_bandwidth_calibrated_bytes_per_s = level.ceiling_bytes_per_s
    record.device_bandwidth_calibrated_spread_bytes_per_s = level.spread_bytes_per_s
    record.device_bandwidth_working_set_bytes = level.working_set_bytes
    record.device_bandwidth_kernel = calibration.kernel
    probe = record.device_bandwidth_bytes_per_s
    if probe is not None:
        record.device_bandwidth_probe_disagrees = level.disagrees(probe)
        if probe > level.ceiling_bytes_per_s:  # a ceiling the machine now beats: its rooflines would read high
            warnings.warn(f"the trial's bandwidth probe streamed {probe / 1e9:.1f} GB/s, above the calibrated ceiling "
                          f"of {level.ceiling_bytes_per_s / 1e9:.1f} GB/s ({source}): the machine is faster than when "
                          "it was calibrated; run `python -m optbench calibrate-bandwidth` again",
                          measure.MeasurementWarning, stacklevel=2)
