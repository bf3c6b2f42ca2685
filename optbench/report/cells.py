"""One summary row's cells as text, for every table (report.md, HTML, the terminal, the README's tables).

The metric cell is the mean ± the half-width of its 95 % Student-t interval ("± n/a" with one seed), `untrained`
where the job did not train (report/bounds.py); the Δ cell is the paired difference to the reference with its
verdict in stats.py's words; beside them the minimum detectable difference and the metric's ceiling.
"""

from __future__ import annotations

import math

import pandas as pd

from optbench.report import stats
from optbench.report.metrics import MEDIAN_INF, QUALITY, TEXT, Metric

UNTRAINED = "untrained"
DETECTABLE = "min. detectable Δ"


def present(value: object) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def count(row: pd.Series, column: str) -> int:
    value = row.get(column)
    return int(value) if present(value) else 0


def metric_cell(row: pd.Series, metric: Metric) -> str:
    """One summary cell: mean ± 95 % CI (n= where fewer values than trials), the median over seeds with
    "reached k/n" for time to target, the texts for a text metric, or the metric's failure word."""
    column = metric.column
    value = row.get(column)
    if metric.scored and untrained_row(row):
        return UNTRAINED
    if metric.aggregate == TEXT:
        return str(value) if present(value) else ""
    if metric.aggregate == MEDIAN_INF:
        n = count(row, f"{column}_n")
        spacing = row.get(f"{column}_resolution")  # the eval curve's: how finely it resolves the crossings
        return stats.TimeToTarget(float(value), count(row, f"{column}_reached"), n, spacing if present(spacing)
                                  else None).text(metric.decimals) if n else ""
    invalid = count(row, f"{column}_invalid")
    if not present(value):
        return metric.invalid_text if invalid else ""
    text = f"{value:,.{metric.decimals}f}"
    ci = row.get(f"{column}_ci")
    if present(ci):
        text += f" ± {ci:,.{metric.decimals}f}"
    elif metric.gate == QUALITY:  # one value: no interval (a bare "± 0" would claim certainty)
        text += " ± n/a"
    n = count(row, f"{column}_n")
    text += f" (n={n})" if n + invalid < count(row, "trials") else ""
    if metric.scored and count(row, "untrained"):
        text += f" ({UNTRAINED} {count(row, 'untrained')}/{n})"
    return text + (f" ({metric.invalid_text} {invalid}/{n + invalid})" if invalid else "")


def untrained_row(row: pd.Series) -> bool:
    """Every seed of the row ended at chance (report/bounds.py)."""
    return bool(count(row, "untrained")) and count(row, "untrained") >= count(row, "eval_target_n")


def trained(rows: pd.DataFrame) -> pd.Series:
    """Per summary row, whether a seed of it trained (not `untrained_row`): the rows a quality figure may come from."""
    return pd.Series([not untrained_row(row) for _, row in rows.iterrows()], index=rows.index, dtype=bool)


def short_quality(row: pd.Series) -> str:
    """The target metric's mean in four digits, or `untrained`."""
    return UNTRAINED if untrained_row(row) else f"{row['eval_target']:.4g}"


def verdict_phrase(row: pd.Series) -> str:
    """The verdict words, with "CI excludes 0" beside them where that adds something."""
    text = row.get("verdict_vs_adamw")
    if not present(text):
        return ""
    adds = row.get("verdict_word_vs_adamw") in (stats.EQUIVALENT, stats.NON_INFERIOR, stats.INCONCLUSIVE)
    return str(text) + ("; CI excludes 0" if adds and row.get("verdict_excludes_zero") is True else "")


def delta_cell(row: pd.Series, words: bool = True) -> str:
    if row.get("delta_untrained") is True:  # no figure; the verdict where it stands (an untrained candidate: worse)
        said = verdict_phrase(row) if words else ""
        return f"{UNTRAINED}: {said}" if said else UNTRAINED
    value = row.get("delta_vs_adamw")
    if not present(value):
        return ""
    unit, ci = row.get("delta_unit"), row.get("delta_vs_adamw_ci")
    text = f"{value:+,.2f} {unit}" if not present(ci) else (
        f"{value:+,.2f} ± {ci:,.2f} {unit} (n={int(row['delta_vs_adamw_n'])})")
    return f"{text}: {verdict_phrase(row)}" if words else text


def detectable_cell(row: pd.Series) -> str:
    """The minimum detectable difference at the comparison's n (stats.minimum_detectable_difference)."""
    value = row.get("detectable_vs_adamw")
    return f"{value:,.2f} {row.get('delta_unit')}" if present(value) else ""


def bound_cell(row: pd.Series) -> str:
    """The target metric's ceiling (floor, for a smaller-is-better metric) on the job's eval split, where known."""
    value = row.get("metric_ceiling")
    return f"{value:,.4f}" if present(value) else ""


def bound_title(target_mode: str) -> str:
    return "ceiling" if target_mode == "max" else "floor"


def band_cell(row: pd.Series) -> str:
    band = row.get("tune_band")
    if not present(band):
        return ""
    return f"±{100 * band:.2f} pts" if row.get("target_scale") == stats.POINTS else f"±{band:.3g}"


def optional(group: pd.DataFrame, column: str, fmt: str) -> list[str]:
    values = group[column] if column in group else pd.Series([None] * len(group), index=group.index)
    return [fmt.format(v) if present(v) else "" for v in values]


def tuned_lr_cell(row: pd.Series) -> str:
    """The chosen lr, with what the walk's range says of it (report/tuning.py): `extended`, `edge`. Where the finals
    shown ran at another lr (a file holding several studies of one job: the tune trials pool, the finals are the
    latest setting's), the cell gives the lr they ran at first: the row's figures are that lr's."""
    lr = row.get("tuned_lr")
    if not present(lr):
        return ""
    ran = row.get("lr")
    if present(ran) and not math.isclose(float(ran), float(lr), rel_tol=1e-9):
        return f"{float(ran):.3g} (the finals' lr; the tune stage chose {float(lr):.3g})"
    note = row.get("tune_range")
    return f"{lr:.3g}" + (f" ({note})" if present(note) and note else "")
