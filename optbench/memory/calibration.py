"""The predictor's calibrations: per device kind, one JSON file keyed by model name.

Two places, the user's first: a file fitted on the user's own machine (`optbench.memory.calibrate` writes it to
`$OPTBENCH_CACHE/calibrations/<kind>.json`, by default `~/.cache/optbench/calibrations/`) takes precedence when
present; else the file shipped in the package (`calibrations/<kind>.json` beside this module, read-only: nothing
writes into an installed package; a checkout ships a new one by copying a fitted file there).

A calibration holds what `optbench.memory.predict` cannot count for one model on one device kind (activation
bytes per token per layer, their seq² attention part, the share of activation pages the allocator still
holds at the optimizer step, the fixed overhead), the trial ids and results files it was fitted on
(`optbench.memory.calibrate`), and how well it fitted them. The file also carries the predictor's error band
measured on held-out trials, which `estimate` prints and turns into a safety margin. Plain data: this
module imports neither torch nor the predictor, so every trial and `estimate` can load it cheaply.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from optbench.probes import cache_dir
from optbench.records.record import MIB

SHIPPED_DIR = Path(__file__).parent / "calibrations"  # read-only: the package's calibrations
# Uncalibrated defaults: on CPU the allocator keeps the freed activation pages (retained share 1, as
# measured on MiniLM); on CUDA the caching allocator's `allocated` counts live tensors only (share 0).
DEFAULT_RETAINED = {"cpu": 1.0, "cuda": 0.0}
DEFAULT_OVERHEAD_BYTES = {"cpu": 64 * 2**20, "cuda": 0}


class CalibrationError(ValueError):
    """Records that cannot calibrate (none usable, or several models mixed), or a file that may not be written;
    the message says what to give."""


@dataclass(frozen=True)
class Calibration:
    """What one model's measured trials say about what cannot be counted, on one device kind.

    Peak on the step phase = weights + grads + state + temporaries + retained_fraction x activations + overhead;
    on the forward/backward phase = weights + state + activations + overhead, where overhead =
    overhead_bytes + the optimizer library's own (`library_overhead_bytes`) and activations =
    bytes_per_token_layer x tokens x layers + bytes_per_s2_layer x batch x heads x seq² x layers. The
    per-token figure folds in the loss head (a causal LM's logits), divided over the layers.
    """

    device_kind: str
    model: str
    precision: str
    bytes_per_token_layer: float
    bytes_per_s2_layer: float
    retained_fraction: float
    overhead_bytes: float
    # extra fixed bytes an optimizer library's step leaves resident, over `overhead_bytes` (which holds for
    # the most tried library, torch, and any library without an entry here)
    library_overhead_bytes: dict[str, float] = field(default_factory=dict)
    # calibrated / analytic activation coefficients (None: the analytic count has no s² part to scale): what
    # an uncalibrated model borrows, since the gap is mostly the machine's allocator and kernels, not the model
    token_scale: float = 1.0
    s2_scale: float | None = None
    trial_ids: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()  # results files the trials were read from
    fit_median_abs_error: float | None = None  # relative, over the calibration trials themselves
    fit_worst_abs_error: float | None = None
    machine: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibration:
        data = dict(data)
        data["trial_ids"], data["sources"] = tuple(data.get("trial_ids", ())), tuple(data.get("sources", ()))
        return cls(**data)

    def overhead_for(self, library: str) -> float:
        return self.overhead_bytes + self.library_overhead_bytes.get(library, 0.0)


@dataclass(frozen=True)
class ErrorBand:
    """The predictor's measured error on held-out trials (optbench.memory.calibrate): |predicted - measured| /
    measured per trial, its median and worst case, and the share of trials it under-predicted."""

    device_kind: str
    trials: int
    median_abs_error: float
    worst_abs_error: float
    worst_under: float  # the largest under-prediction as measured / predicted - 1 (0 when none)
    share_under: float
    table: str = ""  # where the committed per-trial table is
    calibrated: bool = True  # False: the error of the uncalibrated predictor (each model without its calibration)
    worst_under_bytes: int = 0  # the largest under-prediction in bytes, measured - predicted (0: none, or a file
    #                             written before it was kept: the margin is then the share alone)

    @property
    def safety_margin(self) -> float:
        """Fraction to add to a prediction so every held-out trial would have fitted: under-predicting is the
        costly mistake (a run that dies), so the margin covers the worst under-prediction, not the median."""
        return max(self.worst_under, 0.0)

    def margin_bytes(self, predicted_bytes: float) -> int:
        """What to add to a prediction: the held-out trials' worst under-prediction, as a share of it or in
        bytes, whichever is larger (`margin_bytes`)."""
        return margin_bytes(predicted_bytes, self.safety_margin, self.worst_under_bytes)

    def describe_margin(self) -> str:
        return describe_margin(self.safety_margin, self.worst_under_bytes)

    def describe(self) -> str:
        which = "predictor error" if self.calibrated else "uncalibrated predictor error (no own calibration)"
        return (f"{which} on {self.trials} held-out {self.device_kind} trials: median |error| "
                f"{100 * self.median_abs_error:.1f} %, worst {100 * self.worst_abs_error:.1f} %, "
                f"{100 * self.share_under:.0f} % under-predicted; safety margin {self.describe_margin()}")


def describe_margin(fraction: float, floor_bytes: int | None) -> str:
    """The margin_bytes rule in words, as every command that applies it says it: "+6.0 % or 77 MiB, whichever is
    larger" (the share alone where there is no floor)."""
    floor = f" or {floor_bytes / MIB:.0f} MiB, whichever is larger" if floor_bytes else ""
    return f"+{100 * fraction:.1f} %{floor}"


def margin_bytes(predicted_bytes: float, fraction: float, floor_bytes: int) -> int:
    """The safety margin on a predicted peak: `fraction` of it, but never less than `floor_bytes`.

    Why a floor: a CPU peak is RSS, and the allocator's slack is tens of MiB whatever the trial's size (the
    compare gate sees +-19 MiB between sweeps). On a large trial the share covers it; on a small one it is most
    of the error: the first fresh set's 142 MiB prediction measured 187 MiB (+31 %) against a +6 % margin set on
    held-out trials of 220-1,480 MiB (results/cpu-2core/earlier/predictor-fresh-1/coverage.md)."""
    return math.ceil(max(fraction * predicted_bytes, floor_bytes))


@dataclass(frozen=True)
class CalibrationSet:
    """One device kind's calibration file: per model name a Calibration, and the held-out error bands of the
    calibrated predictor and of the uncalibrated one (what a model without a calibration gets)."""

    device_kind: str
    models: dict[str, Calibration] = field(default_factory=dict)
    band: ErrorBand | None = None
    uncalibrated_band: ErrorBand | None = None

    def to_dict(self) -> dict[str, Any]:
        bands = {"validation": self.band, "validation_uncalibrated": self.uncalibrated_band}
        return {"device_kind": self.device_kind, "models": {k: v.to_dict() for k, v in sorted(self.models.items())},
                **{key: {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(band).items()} if band
                   else None for key, band in bands.items()}}

    def band_for(self, calibrated: bool) -> ErrorBand | None:
        return self.band if calibrated else self.uncalibrated_band

    def borrowed(self, leave_out: str = "", library: str = "") -> tuple[float, float, float, float]:
        """(token scale, s² scale, retained fraction, overhead bytes for `library`) for an uncalibrated model:
        medians over the calibrated models on this device kind but `leave_out` (allocator and kernel behaviour
        are the machine's more than the model's), else the analytic defaults (scales 1)."""
        values = [c for name, c in self.models.items() if name != leave_out]
        if not values:
            return 1.0, 1.0, DEFAULT_RETAINED[self.device_kind], DEFAULT_OVERHEAD_BYTES[self.device_kind]
        s2 = [c.s2_scale for c in values if c.s2_scale is not None]
        return (statistics.median(c.token_scale for c in values), statistics.median(s2) if s2 else 1.0,
                statistics.median(c.retained_fraction for c in values),
                statistics.median(c.overhead_for(library) for c in values))


def user_calibration_path(device_kind: str) -> Path:
    """Where the user's own calibration of this device kind lives: `$OPTBENCH_CACHE/calibrations/<kind>.json`,
    else under `$XDG_CACHE_HOME/optbench` or `~/.cache/optbench`."""
    return cache_dir() / "calibrations" / f"{device_kind}.json"


def shipped_calibration_path(device_kind: str) -> Path:
    return SHIPPED_DIR / f"{device_kind}.json"


def calibration_path(device_kind: str) -> Path:
    """The file `load_calibrations` reads: the user's when it exists, else the shipped one (which may not exist)."""
    user = user_calibration_path(device_kind)
    return user if user.is_file() else shipped_calibration_path(device_kind)


def load_calibrations(device_kind: str) -> CalibrationSet:
    """This device kind's calibrations: the user's file when present, else the package's (an empty set when
    there is neither)."""
    return read_calibrations(calibration_path(device_kind), device_kind)


@functools.cache
def read_calibrations(path: Path, device_kind: str) -> CalibrationSet:
    """One calibration file (an empty set for `device_kind` when it does not exist)."""
    if not path.exists():
        return CalibrationSet(device_kind)
    data = json.loads(path.read_text())
    bands = [data.get(key) for key in ("validation", "validation_uncalibrated")]
    return CalibrationSet(device_kind, {name: Calibration.from_dict(c) for name, c in data["models"].items()},
                          *(ErrorBand(**band) if band else None for band in bands))


def refuse_shipped(path: Path) -> None:
    """A CalibrationError for a path in the package's own calibration folder: an installed package is not the
    user's to write (a checkout ships a new calibration by copying a fitted file there)."""
    if path.resolve().parent == SHIPPED_DIR.resolve():
        raise CalibrationError(f"{path} is the package's shipped calibration, read-only: write your own file (by "
                               "default ~/.cache/optbench/calibrations/) and, in a checkout, copy it there to ship it")


def save_calibrations(calibrations: CalibrationSet, path: Path | None = None) -> Path:
    """Write to `path`, by default the user's file for the device kind (which `load_calibrations` then reads).
    The package's own folder is refused: an installed package is not the user's to write."""
    path = path or user_calibration_path(calibrations.device_kind)
    refuse_shipped(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(calibrations.to_dict(), indent=1) + "\n")
    read_calibrations.cache_clear()
    return path
