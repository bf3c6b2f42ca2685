"""Fit the peak-memory predictor's calibration on a few measured trials, and measure its error on others.

`calibrate(records)` fits, for one model on one device kind, the four figures `optbench.memory.predict` cannot
count (activation bytes per token per layer, their seq² attention part, the share of activation pages
still held at the optimizer step, a fixed overhead) by least squares on the relative error of the
predicted peak, and records which trials and files it used. `run_validation` then measures it on held-out
trials with optbench/memory/validation.py (`validation_table`: predicted against measured peaks trial by trial;
`error_band`: the held-out rows summed up into the band `estimate` prints and takes its safety margin from).

    python -m optbench.memory.calibrate --calibrate-on CAL.jsonl --held-out HELD.jsonl --out-dir DIR
        [--calibration-file F]

fits on CAL, then predicts every trial of HELD that was not calibrated on and writes DIR/held-out.md (+ .csv) and
DIR/calibration.md (without --held-out it only fits: the held-out trials can then run with this fit, so that their
own recorded predictions are its); the calibration and its held-out band go to F, by default the user's calibration file
(`~/.cache/optbench/calibrations/<device>.json`, or under `$OPTBENCH_CACHE`), which every prediction on this
machine then reads before the package's shipped one (optbench/memory/calibration.py); never into the package.
Without --calibrate-on it only validates (e.g. the uncalibrated CUDA predictor on a GPU's trials: --device cuda).
A record the band cannot use (not ok, a parallel, fidelity or resume-check trial, evaluations inside the memory
window, no measured peak, an optimizer or model the predictor does not know) is left out with one warning that
counts each reason, and held-out.md says so under the band.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from optbench.job.devices import device_kind
from optbench.memory import predict
from optbench.memory.calibration import (
    Calibration,
    CalibrationError,
    CalibrationSet,
    ErrorBand,
    load_calibrations,
    read_calibrations,
    refuse_shipped,
    save_calibrations,
    user_calibration_path,
)
from optbench.memory.validation import (
    LeftOutWarning,
    error_band,
    measured_peak,
    predicted,
    render_table,
    spec_for,
    unusable_reason,
    usable,
    validation_table,
    warn_left_out,
)
from optbench.optimizers import resolve
from optbench.optimizers.noise import filter_known_noise
from optbench.records import exits
from optbench.records.record import MIB, Record, ResultsFileError, read_records

__all__ = ["CalibrationError", "calibrate", "calibrate_all", "error_band", "main", "measured_peak", "run_validation",
           "usable", "validation_table"]
_FIT_STARTS = ((1.0, 1.0, 1.0, 64.0), (2.0, 1.0, 0.3, 64.0), (1.5, 1.0, 1.0, 0.0))  # (α, β, ρ, overhead MiB)
_BOUNDS = ((0.05, 0.0, 0.0, -1024.0), (50.0, 200.0, 2.0, 4096.0))


def _usable(records: Iterable[Record], purpose: str) -> list[Record]:
    """The records that can calibrate; the others are left out with one LeftOutWarning."""
    records = list(records)
    kept = [r for r in records if usable(r)]
    warn_left_out(Counter(unusable_reason(r) for r in records if not usable(r)), len(records), purpose)
    return kept


@dataclasses.dataclass(frozen=True)
class _Point:
    """One trial's counted parts and activation units: what the fit's residual is computed from."""

    measured: float
    fixed: float  # weights + state: held in both phases
    step_extra: float  # gradients + the step's temporaries
    units: tuple[float, float]  # (token·layers, sample·head·s²·layers)
    library: str  # the optimizer's library: an overhead of its own when the trials allow
    analytic: tuple[float, float]  # the analytic coefficients, the fit's starting point and scale
    autocast: float


def _point(record: Record) -> _Point:
    facts = predict.facts_for_spec(spec_for(record))
    kind = device_kind(record.device)
    bare = predicted(record, kind, None, CalibrationSet(kind))
    params = facts.in_precision(record.precision)
    grads = sum(p.nbytes for p in params)
    assert facts.arch is not None
    return _Point(measured=float(measured_peak(record)), fixed=float(bare.weights_bytes + bare.state_bytes),
                  step_extra=float(grads + bare.temporaries_bytes),
                  units=predict.activation_units(facts.arch, record.batch_size, record.seq_len),
                  library=resolve(record.optimizer).library,
                  analytic=predict.analytic_activation_coefficients(facts.arch, record.precision, kind),
                  autocast=float(predict.autocast_weight_copies(params, record.precision)))


def _coefficients(x: Sequence[float], point: _Point) -> tuple[float, float, float, float]:
    """(bytes per token·layer, bytes per s²·layer, retained share, overhead bytes) from the fit's unknowns,
    which are scaled to order one: α and β multiply the analytic coefficients (β a byte when those are 0)."""
    return x[0] * point.analytic[0], x[1] * (point.analytic[1] or 1.0), x[2], x[3] * MIB


def _peak(x: Sequence[float], point: _Point, libraries: Sequence[str]) -> float:
    per_token, per_s2, retained, overhead = _coefficients(x, point)
    if point.library in libraries:
        overhead += x[4 + libraries.index(point.library)] * MIB
    activations = per_token * point.units[0] + per_s2 * point.units[1] + point.autocast
    return point.fixed + overhead + max(point.step_extra + retained * activations, activations)


def offset_libraries(points: Sequence[_Point]) -> list[str]:
    """The optimizer libraries that get an overhead of their own: each with two trials or more, but the most
    tried one (torch when tied), whose overhead is the base every other library's is added to."""
    counts = Counter(p.library for p in points)
    reference = max(counts, key=lambda lib: (counts[lib], lib == "torch"))
    return sorted(lib for lib, n in counts.items() if n >= 2 and lib != reference)


def _free_parameters(n: int, offsets: int) -> list[int]:
    """Which unknowns (α, β, ρ, overhead, then one overhead per offset library) the fit may move with n
    trials: each library offset takes one trial, then all four from six trials left; fewer fix the seq² part
    at the analytic ratio (β = 1), then the retained share at 1, then the activations' scale."""
    left = n - offsets
    base = [0, 1, 2, 3] if left >= 6 else [0, 2, 3] if left >= 4 else [0, 3] if left >= 2 else [3]
    return base + list(range(4, 4 + offsets))


def _fit(points: list[_Point]) -> tuple[list[float], list[float], list[str]]:
    """Least squares on the relative error of the predicted peak, from a few starts (the max() of the two
    phases makes the cost piecewise): the unknowns, the relative errors at the best fit and the libraries
    with an overhead of their own (dropped when the trials are too few to afford them)."""
    import numpy as np
    from scipy.optimize import least_squares

    libraries = offset_libraries(points)
    if len(points) - len(libraries) < 4:
        libraries = []
    free = _free_parameters(len(points), len(libraries))
    lower = [(_BOUNDS[0] + (-1024.0,) * len(libraries))[i] for i in free]
    upper = [(_BOUNDS[1] + (4096.0,) * len(libraries))[i] for i in free]
    best = None
    for base in _FIT_STARTS:
        start = list(base) + [0.0] * len(libraries)

        def residuals(values, start=start):
            x = list(start)
            for index, value in zip(free, values, strict=True):
                x[index] = value
            return np.array([_peak(x, p, libraries) / p.measured - 1.0 for p in points])

        result = least_squares(residuals, [start[i] for i in free], bounds=(lower, upper))
        if best is None or result.cost < best[0]:
            x = list(start)
            for index, value in zip(free, result.x, strict=True):
                x[index] = float(value)
            best = (result.cost, x, [float(r) for r in result.fun])
    assert best is not None
    return best[1], best[2], libraries


def calibrate(records: Iterable[Record], sources: Sequence[str] = ()) -> Calibration:
    """One model's calibration on one device kind from its usable records (ok, single process, one precision
    throughout). Eight trials or so, varied in batch size, sequence length and optimizer library (two of each
    library to give it its own overhead), pin every figure; fewer fix some (`_free_parameters`). Unusable records
    are left out with a LeftOutWarning."""
    chosen = _usable(records, "calibration")
    groups = Counter((device_kind(r.device), r.model, r.precision) for r in chosen)
    if len(groups) != 1:
        found = ", ".join(f"{m} on {d} at {p}" for d, m, p in groups) or "no ok single-process trial"
        raise CalibrationError(f"calibrate needs the trials of one model on one device kind at one precision, "
                               f"found: {found}; use calibrate_all for several")
    (kind, model, precision), _ = groups.popitem()
    points = [_point(r) for r in chosen]
    x, errors, libraries = _fit(points)
    per_token, per_s2, retained, overhead = _coefficients(x, points[0])
    env = chosen[0].env or {}
    # rounded far below the fit's own error, so the file reads well and every reader predicts the same bytes
    return Calibration(device_kind=kind, model=model, precision=precision, bytes_per_token_layer=round(per_token, 1),
                       bytes_per_s2_layer=round(per_s2, 3), retained_fraction=round(retained, 4),
                       overhead_bytes=round(overhead), token_scale=round(x[0], 4),
                       library_overhead_bytes={lib: round(x[4 + i] * MIB) for i, lib in enumerate(libraries)},
                       s2_scale=round(x[1], 4) if points[0].analytic[1] else None,
                       trial_ids=tuple(r.trial_id for r in chosen), sources=tuple(sources),
                       fit_median_abs_error=round(statistics.median(abs(e) for e in errors), 4),
                       fit_worst_abs_error=round(max(abs(e) for e in errors), 4),
                       machine=str(env.get("gpu") if kind == "cuda" else env.get("cpu_model") or env.get("cpu", "")))


def calibrate_all(records: Iterable[Record], sources: Sequence[str] = ()) -> list[Calibration]:
    """A calibration per (device kind, model) among the usable records, at each group's most common precision."""
    groups: dict[tuple[str, str], list[Record]] = {}
    for record in _usable(records, "calibration"):
        groups.setdefault((device_kind(record.device), record.model), []).append(record)
    calibrations = []
    for group in groups.values():
        precision = Counter(r.precision for r in group).most_common(1)[0][0]
        calibrations.append(calibrate([r for r in group if r.precision == precision], sources))
    return calibrations


def _read(paths: Sequence[Path]) -> list[Record]:
    return [record for path in paths for record in read_records(path)]


def run_validation(calibrate_on: Sequence[Path], held_out: Sequence[Path], out_dir: Path,
                   device: str = "cpu", calibration_file: Path | None = None) -> ErrorBand | None:
    """Calibrate on `calibrate_on` (none: keep the calibrations in use, e.g. to measure the uncalibrated CUDA
    predictor), save them with the held-out band to `calibration_file` (default: the user's file for the device;
    other models' entries kept, from that file when it exists, else from the calibrations in use), and write
    DIR/held-out.md, DIR/held-out.csv and, after a fit, DIR/calibration.md."""
    target = calibration_file or user_calibration_path(device)
    refuse_shipped(target)
    calibrations = calibrate_all(_read(calibrate_on), sources=[str(p) for p in calibrate_on])
    models = dict((read_calibrations(target, device) if target.is_file() else load_calibrations(device)).models)
    models.update({c.model: c for c in calibrations if c.device_kind == device})
    fitted = CalibrationSet(device, models)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not held_out:  # fit only: held-out trials run next, so their own predictions are this calibration's
        save_calibrations(fitted, target)
        _write_fit(calibrate_on, calibrations, fitted, out_dir)
        return None
    table, left_out = _held_out_table(held_out, fitted)
    band = error_band(table, device, str(out_dir / "held-out.md"))
    uncalibrated = error_band(table, device, str(out_dir / "held-out.md"), calibrated=False)
    save_calibrations(dataclasses.replace(fitted, band=band, uncalibrated_band=uncalibrated), target)
    table.to_csv(out_dir / "held-out.csv", index=False, float_format="%.2f")
    (out_dir / "held-out.md").write_text(render_table(table, "Peak-memory predictor: held-out trials", band,
                                                      uncalibrated, left_out))
    _write_fit(calibrate_on, calibrations, fitted, out_dir)
    return band


def _write_fit(calibrate_on: Sequence[Path], calibrations: Sequence[Calibration], fitted: CalibrationSet,
               out_dir: Path) -> None:
    """DIR/calibration.md: the calibration trials against the fit, and what was fitted (nothing without a fit)."""
    if calibrations:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LeftOutWarning)  # the fit has said what it left out
            fitted_table = validation_table(_read(calibrate_on), fitted)
        fit = render_table(fitted_table, "Peak-memory predictor: the calibration trials' fit")
        (out_dir / "calibration.md").write_text(fit + "\n" + _describe_calibrations(calibrations))


def _held_out_table(paths: Sequence[Path], fitted: CalibrationSet) -> tuple[Any, Counter]:
    """The validation table over every file's records no calibration used, each row naming its file
    (`source`: its stem); a trial in two files counts once. With it, the reasons records were left out."""
    import pandas as pd

    seen = {t for c in fitted.models.values() for t in c.trial_ids}
    tables, left_out = [], Counter()
    for path in paths:
        records = read_records(path)
        fresh = [r for r in records if r.trial_id not in seen]
        left_out["calibrated on, or in an earlier file"] += len(records) - len(fresh)
        seen |= {r.trial_id for r in fresh}
        table = validation_table(fresh, fitted, purpose=f"held-out band ({path})")
        left_out.update(table.attrs["left_out"])
        tables.append(table.assign(source=path.stem))
    return pd.concat(tables, ignore_index=True), +left_out


def _describe_calibrations(calibrations: Sequence[Calibration]) -> str:
    lines = []
    for c in calibrations:
        lines.append(f"- {c.model} on {c.device_kind} ({c.precision}): {c.bytes_per_token_layer:,.0f} B per token "
                     f"per layer, {c.bytes_per_s2_layer:,.1f} B per sample·head·seq²·layer, retained share "
                     f"{c.retained_fraction:.2f}, overhead {c.overhead_bytes / MIB:,.1f} MiB{_libraries(c)}; fitted on "
                     f"{len(c.trial_ids)} trials (median |error| {100 * (c.fit_median_abs_error or 0):.1f} %)")
    return "\n".join(lines) + "\n"


def _libraries(c: Calibration) -> str:
    extra = ", ".join(f"{lib} {value / MIB:+,.1f} MiB" for lib, value in sorted(c.library_overhead_bytes.items()))
    return f" ({extra})" if extra else ""


def main(argv: Sequence[str] | None = None) -> int:
    filter_known_noise()  # the meta models import transformers, which imports torchao: its notices are no answer
    parser = argparse.ArgumentParser(prog="python -m optbench.memory.calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calibrate-on", type=Path, nargs="*", default=[],
                        help="results files to fit on (none: validate the calibrations in use as they are)")
    parser.add_argument("--held-out", type=Path, nargs="*", default=[],
                        help="results files to validate on (none: fit only, before the held-out trials run, so "
                             "that their own predictions are this fit's)")
    parser.add_argument("--out-dir", type=Path, required=True, help="where the tables go")
    parser.add_argument("--device", choices=sorted(predict.TARGET_FIELDS), default="cpu")
    parser.add_argument("--calibration-file", type=Path,
                        help="where the calibration and its band go (default: your calibration file, "
                             "~/.cache/optbench/calibrations/<device>.json or under $OPTBENCH_CACHE)")
    args = parser.parse_args(argv)
    if not args.calibrate_on and not args.held_out:
        print("optbench.memory.calibrate: give --calibrate-on (fit), --held-out (validate) or both", file=sys.stderr)
        return exits.USAGE
    missing = [str(p) for p in [*args.calibrate_on, *args.held_out] if not p.is_file()]
    if missing:
        print(f"optbench.memory.calibrate: no such results file (or a folder): {', '.join(missing)}",
              file=sys.stderr)
        return exits.USAGE
    target = args.calibration_file or user_calibration_path(args.device)
    band = None
    error: Exception | str | None = None
    with warnings.catch_warnings(record=True) as left_out:
        warnings.simplefilter("always", LeftOutWarning)
        try:
            band = run_validation(args.calibrate_on, args.held_out, args.out_dir, args.device, target)
        except (CalibrationError, ResultsFileError) as exc:
            error = exc
        except OSError as exc:  # --out-dir or --calibration-file where a file or folder stands in the way
            error = f"cannot write {exc.filename}: {exc.strerror}"
    for warning in left_out:  # one line each, not a warning's file, line and source
        print(f"optbench.memory.calibrate: warning: {warning.message}", file=sys.stderr)
    if error is not None:
        print(f"optbench.memory.calibrate: {error}", file=sys.stderr)
        return exits.USAGE
    print(band.describe() if band else "fitted; no held-out trials given, so no error band yet")
    used = target.resolve() == user_calibration_path(args.device).resolve()
    print(f"wrote {target}" + ("; predictions on this machine read it from now on" if used else
                               f"; predictions read {user_calibration_path(args.device)}: copy it there to use it"))
    return exits.OK


if __name__ == "__main__":
    sys.exit(main())
