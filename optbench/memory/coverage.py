"""A predictor margin tested on data it was not derived from: coverage on fresh trials, from the records' own
predictions.

The peak predictor is calibrated on some trials (`calibrate`), and its safety margin is set from others, the
held-out ones (the worst under-prediction among them). Neither set can say whether the margin holds: the
calibration trials were fitted to, and the margin was chosen to cover the held-out trials exactly. Coverage asks a
third set, fresh trials of other shapes (batches and lengths outside the calibration's range included): the share
whose measured peak stays under prediction + margin (the held-out worst under-prediction, as a share or in bytes,
whichever is larger: `ErrorBand.margin_bytes`). Every figure here is read from the records themselves —
`predicted_peak_bytes`, the prediction each trial made before its first step with the calibration it had — never
recomputed with today's predictor, so a published figure is what the trials saw.

    python -m optbench.memory.coverage --calibration CAL.jsonl --held-out HELD.jsonl --fresh FRESH.jsonl

prints the held-out band (the margin's source), the coverage and the per-trial table; it exits 1 when the coverage
is under REQUIRED_COVERAGE.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optbench.job.devices import device_kind
from optbench.memory.calibration import ErrorBand
from optbench.memory.validation import measured_peak, usable
from optbench.optimizers.noise import filter_known_noise
from optbench.records import exits
from optbench.records.record import MIB, Record, read_records

REQUIRED_COVERAGE = 0.95


def _predicted(records: Iterable[Record]) -> list[Record]:
    """The usable records that carry their own prediction."""
    return [r for r in records if usable(r) and r.predicted_peak_bytes]


def own_band(records: Iterable[Record], device: str = "cpu", table: str = "") -> ErrorBand:
    """The predictor's error on `records` from their own predictions: median and worst |error|, the worst
    under-prediction (measured / predicted - 1, and in bytes) — the safety margin — and the share under-predicted."""
    rows = [r for r in _predicted(records) if device_kind(r.device) == device]
    if not rows:
        raise ValueError(f"no {device} record with its own predicted_peak_bytes to measure the predictor on")
    errors = [(r.predicted_peak_bytes - measured_peak(r)) / measured_peak(r) for r in rows]  # type: ignore[operator]
    over = [measured_peak(r) / r.predicted_peak_bytes - 1 for r in rows]  # type: ignore[operator]
    over_bytes = [measured_peak(r) - r.predicted_peak_bytes for r in rows]  # type: ignore[operator]
    return ErrorBand(device_kind=device, trials=len(rows), median_abs_error=statistics.median(abs(e) for e in errors),
                     worst_abs_error=max(abs(e) for e in errors), worst_under=max(max(over), 0.0),
                     share_under=sum(e < 0 for e in errors) / len(errors), table=table,
                     worst_under_bytes=max(max(over_bytes), 0))


def shape_ranges(records: Iterable[Record]) -> dict[str, tuple[int, int, int, int]]:
    """Per workload, the (min batch, max batch, min seq, max seq) the calibration saw."""
    ranges: dict[str, tuple[int, int, int, int]] = {}
    for r in records:
        low_b, high_b, low_s, high_s = ranges.get(r.workload, (r.batch_size, r.batch_size, r.seq_len, r.seq_len))
        ranges[r.workload] = (min(low_b, r.batch_size), max(high_b, r.batch_size), min(low_s, r.seq_len),
                              max(high_s, r.seq_len))
    return ranges


def _outside(record: Record, ranges: dict[str, tuple[int, int, int, int]]) -> str:
    """'batch above', 'seq below', ...: where a trial's shape leaves the calibration's range ('' inside it)."""
    low_b, high_b, low_s, high_s = ranges.get(record.workload, (0, 0, 0, 0))
    parts = []
    for name, value, low, high in (("batch", record.batch_size, low_b, high_b), ("seq", record.seq_len, low_s, high_s)):
        if not low <= value <= high:
            parts.append(f"{name} {'above' if value > high else 'below'}")
    return ", ".join(parts)


@dataclass(frozen=True)
class Coverage:
    covered: int
    trials: int
    margin: ErrorBand  # the held-out band whose margin the fresh trials test
    outside_range: int  # fresh trials with a batch or length outside the calibration's range
    table: Any  # pandas DataFrame, one row per fresh trial
    covered_by_share: int = 0  # of them under prediction x (1 + the share) alone: what the floor in bytes adds

    @property
    def share(self) -> float:
        return self.covered / self.trials if self.trials else 0.0

    def describe(self) -> str:
        met = "met" if self.share >= REQUIRED_COVERAGE else "NOT met"
        return (f"coverage {self.covered}/{self.trials} = {100 * self.share:.1f} % of fresh trials under prediction "
                f"{self.margin.describe_margin()} ({self.outside_range} of them outside the calibration's batch or "
                f"length range; at least {100 * REQUIRED_COVERAGE:.0f} % required: {met}; the share alone, "
                f"+{100 * self.margin.safety_margin:.1f} %, covers {self.covered_by_share}/{self.trials})")


def coverage(fresh: Iterable[Record], band: ErrorBand, calibration: Sequence[Record], held_out: Sequence[Record]
             ) -> Coverage:
    """The share of fresh trials (none of them a calibration or held-out trial) whose measured peak is at most
    their own prediction plus the band's margin (ErrorBand.margin_bytes)."""
    import pandas as pd

    used = {r.trial_id for r in [*calibration, *held_out]}
    ranges = shape_ranges(r for r in calibration if usable(r))
    rows, by_share = [], 0
    for r in _predicted(fresh):
        if r.trial_id in used:
            continue
        measured, predicted = measured_peak(r), int(r.predicted_peak_bytes)  # type: ignore[arg-type]
        margin_bytes = band.margin_bytes(predicted)
        by_share += measured <= predicted * (1 + band.safety_margin)
        rows.append({"workload": r.workload, "optimizer": r.optimizer, "batch": r.batch_size, "seq": r.seq_len,
                     "predicted MiB": predicted / MIB, "measured MiB": measured / MIB,
                     "over prediction %": 100 * (measured / predicted - 1), "margin MiB": margin_bytes / MIB,
                     "covered": measured <= predicted + margin_bytes, "outside calibration range": _outside(r, ranges)})
    table = pd.DataFrame(rows)
    covered = int(table["covered"].sum()) if len(table) else 0
    outside = int((table["outside calibration range"] != "").sum()) if len(table) else 0
    return Coverage(covered, len(table), band, outside, table, by_share)


def report(calibration: Sequence[Record], held_out: Sequence[Record], fresh: Sequence[Record]) -> tuple[str, Coverage]:
    """The held-out band (the margin's source) and the coverage of that margin on the fresh trials, as markdown."""
    band = own_band(held_out)
    found = coverage(fresh, band, calibration, held_out)
    shown = found.table.sort_values(["workload", "optimizer", "batch", "seq"]) if len(found.table) else found.table
    text = "\n\n".join([f"held-out (the margin's source, own predictions): {band.describe()}", found.describe(),
                        shown.to_markdown(index=False, floatfmt=".1f") if len(shown) else "(no fresh trial)"])
    return text + "\n", found


def main(argv: Sequence[str] | None = None) -> int:
    filter_known_noise()  # as every entry point does (optbench/optimizers/noise.py)
    parser = argparse.ArgumentParser(prog="python -m optbench.memory.coverage", description=__doc__.split("\n\n")[0])
    for flag in ("--calibration", "--held-out", "--fresh"):
        parser.add_argument(flag, type=Path, required=True)
    args = parser.parse_args(argv)
    missing = [str(p) for p in (args.calibration, args.held_out, args.fresh) if not p.is_file()]
    if missing:
        print(f"optbench.memory.coverage: no such results file: {', '.join(missing)}", file=sys.stderr)
        return exits.USAGE
    try:
        text, found = report(*(read_records(p) for p in (args.calibration, args.held_out, args.fresh)))
    except ValueError as exc:
        print(f"optbench.memory.coverage: {exc}", file=sys.stderr)
        return exits.USAGE
    print(text, end="")
    return exits.OK if found.share >= REQUIRED_COVERAGE else exits.CHECK_FAILED


if __name__ == "__main__":
    sys.exit(main())
