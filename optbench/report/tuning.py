"""Whether a study's lr range bracketed the optimum, read from the tune records (so the report says what the
study did).

The study's tune stage (optbench/workflows/study.py) steps one grid point past the registry's lr range when the
best lr it found sits at an end of that range, and marks that trial's `lr_source` EXTENDED. What the report says
beside the tuned lr:

- `extended`: a point past the registry range was tried;
- `edge`: the best lr is the largest (or smallest) lr tried, with nothing tried beyond it, so the optimum may lie
  further out; never left unsaid.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from optbench.report import stats

GRID = "study: grid"  # lr_source of a tune trial at a point of the registry's grid (or --lr-grid)
EXTENDED = "study: extended past the range"  # lr_source of a tune trial one grid step past the range
CHOSEN = "study: chosen"  # lr_source of a final trial at the chosen lr


def step_past(grid: Sequence[float], upward: bool) -> float:
    """One grid step past the end of `grid`: its mean log spacing, rounded to three significant digits like the
    registry's grids."""
    grid = sorted(grid)
    ratio = (grid[-1] / grid[0]) ** (1 / (len(grid) - 1))
    return float(f"{(grid[-1] * ratio if upward else grid[0] / ratio):.3g}")


def best_point(choice: stats.LrChoice) -> stats.LrPoint | None:
    usable = [p for p in choice.points if p.status == "ok" and p.value is not None]
    if not usable:
        return None
    return (max if choice.mode == "max" else min)(usable, key=lambda p: p.value)  # type: ignore[arg-type,return-value]


def edge(choice: stats.LrChoice) -> str | None:
    """"top" or "bottom" when the best lr is the largest or smallest lr tried (of two or more), else None."""
    best, tried = best_point(choice), [p.lr for p in choice.points if p.status != "missing"]
    if best is None or len(tried) < 2:
        return None
    if math.isclose(best.lr, max(tried), rel_tol=1e-9):
        return "top"
    return "bottom" if math.isclose(best.lr, min(tried), rel_tol=1e-9) else None


def range_note(choice: stats.LrChoice, sources: Iterable[str | None]) -> str:
    """"extended", "edge", "extended, edge" or "": what the tuned-lr cell says beside the lr."""
    said = ["extended"] if EXTENDED in set(sources) else []
    return ", ".join(said + (["edge"] if edge(choice) else []))
