"""What the regression gate gets right and wrong on a machine, from a campaign of repeated runs (scripts/gate-campaign).

The campaign leaves, under one folder, runs of one commit (`same/run-NN.jsonl`, each a sweep with several seeds, so
several processes per optimizer) and runs with an injected optimizer.step() slowdown (`slow-<fraction>/run-NN.jsonl`).
Same-commit runs pair up two by two (00 with 01, 02 with 03, ...): a flagged row there is a false alarm. The k-th run
of each slowdown is compared with the BASE side of the k-th same-commit pair: a flagged row is a detection. Every
comparison is `compare` itself at the campaign's limit, on the optimizer step. The summary gives each rate with its
counts and the measured change against the injected one: the gate's noise on this machine, not an assumption.

    python -m optbench.report.campaign FOLDER          # the summary table (markdown)
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from optbench.records import exits
from optbench.records.record import read_records
from optbench.report import compare, metrics

# The campaign's gate: the optimizer step's interval must lie wholly past +10 %. The CPU default (25 %) was set for
# the old within-run interval; +20 % could never be flagged under it.
CAMPAIGN_LIMITS = compare.Thresholds(max_slowdown_pct=10.0, max_memory_growth_pct=1e9, max_accuracy_drop_pts=1e9,
                                     max_metric_worsening_pct=1e9)
METRIC = "opt_step_ms"
TOLERANCE_PTS = 5.0  # the measured slowdown must be the injected one ± this many points


@dataclass
class Outcome:
    """One kind of comparison (same-commit, or one injected slowdown) for one optimizer: how often it was flagged,
    and the measured changes; `unadjusted_*`: the same without the covariance analysis (report/noise.py), the
    figures the gate read before it, for the comparisons it `adjusted` (elsewhere the two agree)."""

    injected_pct: float
    flagged: int = 0
    compared: int = 0
    changes: list[float] = field(default_factory=list)
    adjusted: int = 0
    unadjusted_flagged: int = 0
    unadjusted_changes: list[float] = field(default_factory=list)

    def within_tolerance(self, unadjusted: bool = False) -> int:
        changes = self.unadjusted_changes if unadjusted else self.changes
        return sum(abs(c - self.injected_pct) <= TOLERANCE_PTS for c in changes)

    def _measured(self, flagged: int, changes: list[float], unadjusted: bool) -> str:
        spread = f"{statistics.median(changes):+.1f} % ({min(changes):+.1f} … {max(changes):+.1f})"
        within = f"within ±{TOLERANCE_PTS:g} pts of {self.injected_pct:+g} %: {self.within_tolerance(unadjusted)}"
        return f"flagged {flagged}/{self.compared}; measured {spread}; {within}/{self.compared}"

    def cell(self) -> str:
        if not self.compared:
            return ""
        if not self.adjusted:
            return self._measured(self.flagged, self.changes, False)
        return (f"{self._measured(self.flagged, self.changes, False)} (adjusted: {self.adjusted}/{self.compared}); "
                f"unadjusted: {self._measured(self.unadjusted_flagged, self.unadjusted_changes, True)}")


def _runs(folder: Path) -> list[Path]:
    return sorted(folder.glob("run-*.jsonl")) if folder.is_dir() else []


def pairs(root: Path) -> dict[str, list[tuple[Path, Path, float]]]:
    """(BASE, NEW, injected %) per kind: "same-commit" pairs and one "+N % injected" list per slowdown folder."""
    same = _runs(root / "same")
    kinds = {"same-commit": [(a, b, 0.0) for a, b in zip(same[0::2], same[1::2], strict=False)]}
    bases = same[0::2]
    for folder in sorted(root.glob("slow-*"), key=lambda p: float(p.name.removeprefix("slow-"))):
        fraction = float(folder.name.removeprefix("slow-"))
        kinds[f"+{100 * fraction:g} % injected"] = [(base, new, 100 * fraction)
                                                    for base, new in zip(bases, _runs(folder), strict=False)]
    return kinds


def outcomes(root: Path) -> dict[str, dict[str, Outcome]]:
    """Per kind and optimizer, the flagged count and the measured optimizer-step changes."""
    found: dict[str, dict[str, Outcome]] = {}
    for kind, listed in pairs(root).items():
        per_optimizer = found.setdefault(kind, {})
        for base, new, injected in listed:
            result = compare.compare(read_records(base), read_records(new), CAMPAIGN_LIMITS)
            for row in result.rows.itertuples():
                delta = getattr(row, f"{METRIC}_delta")
                if delta is None or delta != delta:
                    continue
                outcome = per_optimizer.setdefault(row.optimizer, Outcome(injected))
                flagged = "optimizer step" in str(row.regression)
                outcome.compared += 1
                outcome.flagged += flagged
                outcome.changes.append(float(delta))
                before = getattr(row, f"{METRIC}_unadjusted")
                if isinstance(before, tuple):  # the gate's own rule, on the change the adjustment replaced
                    outcome.adjusted += 1
                    outcome.unadjusted_flagged += compare.crossed(
                        metrics.BY_COLUMN[METRIC], compare.Change(*before), CAMPAIGN_LIMITS) is not None
                    outcome.unadjusted_changes.append(float(before[0]))
                else:
                    outcome.unadjusted_flagged += flagged
                    outcome.unadjusted_changes.append(float(delta))
    return found


def summary_markdown(root: Path) -> str:
    """One row per kind, one column per optimizer: flagged k/n (a false-alarm rate for same-commit pairs, a detection
    rate for injected slowdowns) and the measured change (median, range, how often within the tolerance)."""
    import pandas as pd

    found = outcomes(root)
    if not any(found.values()):
        return "not measured yet"
    optimizers = list(dict.fromkeys(name for per in found.values() for name in per))
    table = pd.DataFrame([{"comparison": kind, **{name: per[name].cell() if name in per else "" for name in optimizers}}
                          for kind, per in found.items() if per])
    runs = max((len({r.seed for r in read_records(p)}) for p in _runs(root / "same")), default=0)
    return (table.to_markdown(index=False) + f"\n\n{runs} processes (seeds) per run and side; the optimizer step is "
            f"flagged when its whole 95 % interval (from the spread between processes) lies past "
            f"+{CAMPAIGN_LIMITS.max_slowdown_pct:g} %; adjusted: compared by covariance analysis on each process's "
            f"rest of the step (report/noise.py), unadjusted: what the gate read without it")


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python -m optbench.report.campaign FOLDER (a scripts/gate-campaign output)", file=sys.stderr)
        return exits.USAGE
    print(summary_markdown(Path(argv[0])))
    return exits.OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
