"""Records -> the per-trial frame -> the per-job summary every renderer and `compare` read.

Jobs are grouped by their job key (`record.job_key`, or `results.job_key(record)` for a record built by
hand), never by parsing a label; the label (`job_label`) is for headings only. A re-run trial
(same trial_id) counts once, with its latest record.

Study records: the tune stage runs each optimizer's lr grid at the finals' job (`stage="tune"`, the tune
seeds); the final stage adds the other seeds at the chosen lr (`stage="final"`). The lr is chosen from the
tune records alone (`stats.choice_from_records`); an optimizer's finals are every record at the lr its finals
ran at (the chosen one, before they ran) that has eval metrics, tune or final. Schema-1 study files tuned on
fewer steps and carried only validation metrics: their tune records join the finals' job by the key without
steps, warm-up and eval size. Records of a plain `run` (stage None) are finals of their job. Per job and
optimizer the finals are those at its latest setting (lr and kwargs): other settings' trials are left out, said in a
warning, never pooled with them as seeds.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from optbench.records.peaks import split_peak_memory
from optbench.records.record import REFERENCE_OPTIMIZER, Record, job_key
from optbench.report import bounds, metrics, stats, tuning
from optbench.report.cells import untrained_row
from optbench.report.metrics import MEAN, MEDIAN_INF, MEMORY_HEADLINE, SPEED_HEADLINE, TEXT, Metric, record_values

TARGET_SHARE = 0.95  # default target: 95 % of the best final mean ("max"), best / 0.95 ("min")
MEM_SAVED = f"mem saved % vs {REFERENCE_OPTIMIZER}"
SPEED = f"speed x vs {REFERENCE_OPTIMIZER}"
LOOSE_FIELDS = ("steps", "warmup_steps", "eval_size")  # what a schema-1 tune record may differ in from its finals
SIDE_BY_SIDE_FIELDS = ("precision", "engine")  # jobs differing only in these share the side-by-side table
TUNING = ("tuned_lr", "tune_steps", "tune_points", "tunability", "tune_band", "tune_band_basis", "tune_seeds",
          "tune_range")


def job_label(key: dict[str, Any]) -> str:
    """The job in words, for headings: model, data, device, size, then whatever differs from the defaults."""
    options = "".join(f", {name} {value}" for name, value in sorted((key.get("workload_options") or {}).items()))
    scratch = ", trained from scratch" if key.get("pretrained") is False else ""
    parts = [f"{key.get('model')}{options} on {key.get('dataset')}{scratch}, {key.get('device')}, {key.get('steps')} "
             f"steps x batch {key.get('batch_size')} x seq {key.get('seq_len')}, {key.get('schedule')} lr"]
    if key.get("precision") not in (None, "fp32"):
        parts.append(f"{key['precision']} weights")
    if key.get("engine") not in (None, "native"):
        parts.append(f"{key['engine']} engine")
    if key.get("parallel") not in (None, "none"):
        parts.append(f"{key['parallel']} x{key.get('world_size') or 1}")
    if key.get("resume_check"):
        parts.append("resume check")
    if key.get("fidelity"):
        parts.append("+ fidelity probe")
    return ", ".join(parts)


def job_id(key: dict[str, Any]) -> str:
    """A job key as a canonical string: what frames group by."""
    return json.dumps(key, sort_keys=True, default=str)


def job_id_without(key: dict[str, Any], fields: Iterable[str]) -> str:
    """The job id of `key` without `fields`: jobs that differ only in those share it."""
    return job_id({name: value for name, value in key.items() if name not in fields})


def key_difference(first: pd.DataFrame, second: pd.DataFrame) -> str:
    """"; they differ in FIELD (a vs b), ..." of two summaries' jobs whose labels read alike (a label names only
    some of the key), else nothing."""
    if first.empty or second.empty or set(first["job"]) != set(second["job"]):
        return ""
    a, b = json.loads(first["job_id"].iloc[0]), json.loads(second["job_id"].iloc[0])
    return "; they differ in " + ", ".join(f"{name} ({a.get(name)!r} vs {b.get(name)!r})"
                                           for name in sorted({*a, *b}) if a.get(name) != b.get(name))


def _row(record: Record) -> dict[str, Any]:
    copy = dataclasses.replace(record)  # the caller's records stay as they were read
    split_peak_memory(copy)  # records from benchmark JSON or older files may lack the split
    key = dict(copy.job_key or job_key(copy))
    copy.job_key = key
    row = copy.to_dict()
    row.update(record_values(copy), record=copy, job_id=job_id(key))
    row["untrained"] = copy.status == "ok" and bounds.untrained(row["eval_target"], copy.metric_chance,
                                                                 copy.target_mode)
    return row


def latest_per_trial(records: Iterable[Record]) -> list[Record]:
    """Each trial once, as its latest record says (a rerun of a failed trial appends, the file keeps both): in the
    order the trials first appear. Every table reads a file this way; the file itself keeps every attempt."""
    latest: dict[str, Record] = {}
    for record in records:
        latest[record.trial_id] = record  # a key seen before keeps its place and takes the newer record
    return list(latest.values())


def trials_frame(records: Iterable[Record]) -> pd.DataFrame:
    """One row per trial (latest record per trial_id): the Record's fields, every metric of the table, the job
    (`job_id`, label `job`), whether the trial is a final of its job (`final`) and its time to target."""
    frame = pd.DataFrame([_row(record) for record in latest_per_trial(records)])
    if frame.empty:
        return frame
    _link_schema1_tune_records(frame)
    frame["job"] = frame["job_id"].map(_labels(frame))
    frame["weight_precision"] = [key.get("precision") or "fp32" for key in frame["job_key"]]
    _mark_finals(frame, lr_choices(frame))
    _add_time_to_target(frame)
    return frame


def _link_schema1_tune_records(frame: pd.DataFrame) -> None:
    """Tune records whose key matches no final's: moved to the final job that matches without LOOSE_FIELDS."""
    tune = frame["stage"] == "tune"
    finals = dict(zip(frame.loc[~tune, "job_id"], frame.loc[~tune, "job_key"], strict=True))
    loose = {job_id_without(key, LOOSE_FIELDS): (ident, key) for ident, key in finals.items()}
    for index in frame.index[tune & ~frame["job_id"].isin(list(finals))]:
        match = loose.get(job_id_without(frame.at[index, "job_key"], LOOSE_FIELDS))
        if match is not None:
            frame.at[index, "job_id"], frame.at[index, "job_key"] = match


def _labels(frame: pd.DataFrame) -> dict[str, str]:
    """job_id -> heading. Two keys with one label (they differ in a field the label leaves out) get the
    differing fields appended, so no two jobs share a heading."""
    keys = dict(zip(frame["job_id"], frame["job_key"], strict=True))
    plain = {ident: job_label(key) for ident, key in keys.items()}
    labels = dict(plain)
    for ident, label in plain.items():
        twins = [other for other, text in plain.items() if text == label and other != ident]
        differ = sorted({name for other in twins for name, value in keys[other].items()
                         if keys[ident].get(name) != value})
        if differ:
            labels[ident] = label + " (" + ", ".join(f"{name} {keys[ident].get(name)}" for name in differ) + ")"
    return labels


def lr_choices(frame: pd.DataFrame) -> dict[tuple[str, str], stats.LrChoice]:
    """The lr choice per (job_id, optimizer), from that pair's `stage == "tune"` records alone."""
    if "stage" not in frame:
        return {}
    tune = frame[frame["stage"] == "tune"]
    return {(job, optimizer): stats.choice_from_records(str(optimizer), sorted(set(group["lr"].astype(float))),
                                                        list(group["record"]), int(group["steps"].max()))
            for (job, optimizer), group in tune.groupby(["job_id", "optimizer"], sort=False)}


def _mark_finals(frame: pd.DataFrame, choices: dict[tuple[str, str], stats.LrChoice]) -> None:
    """`final`: every non-tune trial, and the tune trials at the finals' lr that carry eval metrics."""
    final = frame["stage"] != "tune"
    for column in TUNING:
        frame[column] = None
    for (job, optimizer), choice in choices.items():
        rows = (frame["job_id"] == job) & (frame["optimizer"] == optimizer)
        ran = frame[rows & (frame["stage"] == "final")]
        lr = float(ran["lr"].iloc[-1]) if len(ran) else choice.lr
        if lr is not None:
            final |= rows & (frame["stage"] == "tune") & frame["eval_target"].notna() & np.isclose(
                frame["lr"].astype(float), lr, rtol=1e-9, atol=0)
        ok = sum(point.status == "ok" for point in choice.points)
        sources = frame.loc[rows & (frame["stage"] == "tune"), "lr_source"]
        values = (choice.lr, choice.tune_steps, f"{ok}/{len(choice.points)}", choice.tunability, choice.band,
                  choice.band_basis, choice.tune_seeds, tuning.range_note(choice, sources))
        for column, value in zip(TUNING, values, strict=True):
            frame.loc[rows, column] = value
    frame["final"] = final & _at_latest_setting(frame, final) | _failed_tuning(frame, final)


def _failed_tuning(frame: pd.DataFrame, final: pd.Series) -> pd.Series:
    """Per job and optimizer with no final trial, its tune trials where none ended ok: the study stopped there, and
    the table says how ("timeout 2/2") instead of leaving the optimizer out (a study whose every trial failed
    rendered an empty report)."""
    shown = pd.Series(False, index=frame.index)
    for _, rows in frame.groupby(["job_id", "optimizer"], sort=False):
        if not final[rows.index].any() and (rows["stage"] == "tune").all() and (rows["status"] != "ok").all():
            shown[rows.index] = True
    return shown


def _setting(row: pd.Series) -> str:
    """An optimizer's setting in a trial: its lr and its kwargs (what `--lr` and `--optimizer-kwargs` change)."""
    lr = row.get("lr")
    return json.dumps([None if lr is None or lr != lr else float(lr), row.get("optimizer_kwargs") or {}],
                      sort_keys=True, default=str)


def _at_latest_setting(frame: pd.DataFrame, final: pd.Series) -> pd.Series:
    """Per job and optimizer, the finals at its latest setting only: a file holding `run --lr 1e-3` and then
    `run --lr 1e-2` of one job would otherwise pool both lrs' trials as if they were seeds of one result. The
    finals left out are said in a warning (the file keeps them; another --out keeps each setting's own table)."""
    keep = pd.Series(True, index=frame.index)
    for (_, optimizer), rows in frame[final].groupby(["job_id", "optimizer"], sort=False):
        seen = rows.apply(_setting, axis=1)  # of the finals only: the tune grid's lrs differ by design
        if seen.nunique() > 1:
            latest, job = seen.iloc[-1], rows["job"].iloc[0]
            left_out = seen[seen != latest]
            keep[left_out.index] = False
            others = ", ".join(_said(text) for text in dict.fromkeys(left_out))
            warnings.warn(f"{optimizer} ran at {others} and at {_said(latest)} in one job ({job}): the tables show "
                          f"its latest setting, {_said(latest)}; the other {len(left_out)} trial(s) are left out, "
                          "not pooled as its seeds", stacklevel=2)
    return keep


def _said(setting: str) -> str:
    """A setting in words: `lr 0.001 {"momentum": 0.9}`."""
    lr, kwargs = json.loads(setting)
    words = ([f"lr {lr:g}"] if lr is not None else []) + ([json.dumps(kwargs, sort_keys=True)] if kwargs else [])
    return " ".join(words) or "no lr"


def fixed_targets(frame: pd.DataFrame) -> dict[str, bool]:
    """Per job: whether its target was fixed before its trials ran (given with the records: `--target`, or a
    study's target from its tune stage), rather than set after the fact from the finals."""
    given = pd.to_numeric(frame.get("target_value", pd.Series(dtype=float)), errors="coerce")
    return {job: bool(given[rows.index].notna().any()) for job, rows in frame.groupby("job_id", sort=False)}


def job_targets(frame: pd.DataFrame) -> dict[str, float]:
    """Per job: a target given with the records (`--target`, or a study's, fixed from its tune stage before the
    finals), else — after the fact — TARGET_SHARE of the best optimizer's mean final metric (for a "min" metric
    such as perplexity: best / TARGET_SHARE) over the trials that trained: one from trials at chance would lie
    where every curve starts."""
    targets = {}
    for job, group in frame[frame["final"] & (frame["status"] == "ok")].groupby("job_id", sort=False):
        given = pd.to_numeric(group["target_value"], errors="coerce").dropna()
        means = group[~group["untrained"].astype(bool)].groupby("optimizer")["eval_target"].mean().dropna()
        if len(given):
            targets[job] = float(given.iloc[-1])
        elif len(means):
            targets[job] = (means.max() * TARGET_SHARE if group["target_mode"].iloc[0] == "max"
                            else means.min() / TARGET_SHARE)
    return targets


def _add_time_to_target(frame: pd.DataFrame) -> None:
    """Steps and training seconds to the job's target per final trial with an eval curve: inf when the curve
    never got there (a miss counts, AlgoPerf's rule), NaN when there is no curve to read."""
    targets = job_targets(frame)
    steps, seconds, brackets = [], [], []
    for row in frame.itertuples():
        curve = row.eval_curve if isinstance(row.eval_curve, list) and row.eval_curve else None
        hit = None if curve is None or not row.final or row.job_id not in targets else \
            stats.reached(curve, targets[row.job_id], row.target_mode)
        missed = np.nan if curve is None or not row.final or row.job_id not in targets else np.inf
        steps.append(hit.step if hit else missed), seconds.append(hit.seconds if hit else missed)
        brackets.append(hit.bracket_s if hit else np.nan)
    frame["steps_to_target"], frame["time_to_target_s"] = steps, seconds
    frame["time_to_target_bracket_s"] = brackets
    frame["job_target"] = frame["job_id"].map(targets)
    frame["job_target_fixed"] = frame["job_id"].map(fixed_targets(frame))


def aggregate(metric: Metric, values: pd.Series) -> dict[str, Any]:
    """One metric over a group's seeds: mean ± CI (`_std`, `_ci`, `_n`, and `_invalid` for values beyond
    `invalid_above`), median with misses as infinite (`_reached`, `_n`), or the distinct texts."""
    column = metric.column
    if metric.aggregate == TEXT:
        return {column: "/".join(sorted({str(v) for v in values.dropna()})) or None}
    numbers = pd.to_numeric(values, errors="coerce")
    if metric.aggregate == MEDIAN_INF:
        ttt = stats.time_to_target(numbers.tolist())
        return {column: ttt.median if ttt else None, f"{column}_reached": ttt.reached if ttt else None,
                f"{column}_n": ttt.n if ttt else 0}
    assert metric.aggregate == MEAN
    numbers = numbers[np.isfinite(numbers)]
    invalid = numbers > metric.invalid_above if metric.invalid_above is not None else numbers != numbers
    good = numbers[~invalid]
    interval = stats.mean_ci(good.tolist())
    return {column: interval.mean if interval else None, f"{column}_std": good.std() if len(good) > 1 else None,
            f"{column}_ci": interval.half_width if interval else None, f"{column}_n": len(good),
            f"{column}_invalid": int(invalid.sum())}


def _summary_row(group: pd.DataFrame, of_trials: int) -> dict[str, Any]:
    first, key = group.iloc[0], group.iloc[0]["job_key"]
    status = str(first["status"])
    row = {"job": first["job"], "job_id": first["job_id"], "optimizer": first["optimizer"],
           "precision": first["state_precision"], "weight_precision": first["weight_precision"],
           "engine": key.get("engine") or "native", "status": status, "trials": len(group), "of_trials": of_trials,
           "error": "; ".join(sorted({str(e) for e in group["error"].dropna()}))[:200] or None,
           "target_metric": first["target_metric"] or "accuracy", "target_mode": first["target_mode"] or "max",
           "job_target": first["job_target"], "job_target_fixed": first["job_target_fixed"], "lr": first["lr"],
           "steps": key.get("steps"),
           "warmup_steps": key.get("warmup_steps"), "schedule": key.get("schedule"),
           "side_id": job_id_without(key, SIDE_BY_SIDE_FIELDS), **{name: first[name] for name in TUNING}}
    if status == "ok":
        for metric in metrics.METRICS:
            row.update(aggregate(metric, group[metric.column]))
        brackets = pd.to_numeric(group["time_to_target_bracket_s"], errors="coerce").dropna()
        row["time_to_target_s_resolution"] = float(brackets.median()) if len(brackets) else None
        row.update(untrained=int(group["untrained"].sum()), metric_ceiling=bounds.single(group["metric_ceiling"]),
                   metric_chance=bounds.single(group["metric_chance"]), eval_rows=bounds.single(group["eval_rows"]))
        if untrained_row(row):  # no quality figure from a job that did not train, in summary.csv and json too
            row.update({f"{m.column}{part}": None for m in metrics.METRICS if m.scored for part in ("", "_std", "_ci")})
    return row


def summarize(frame: pd.DataFrame, margin: float | None = None) -> pd.DataFrame:
    """One row per (job, optimizer, status) of the final trials: every metric of the table summarised over
    seeds, the tuning columns, and the columns relative to the reference optimizer (`relative_columns`).
    `margin`: the verdicts' margin in the target metric's unit (points, or % of the reference); None: 1
    point for a metric in [0, 1], 2 % otherwise."""
    if frame.empty or not frame["final"].any():
        return pd.DataFrame(columns=["job", "job_id", "side_id", "optimizer", "status", "target_metric",
                                     "target_mode"])
    finals = frame[frame["final"]]
    counts = finals.groupby(["job_id", "optimizer"], sort=False).size()
    rows = [_summary_row(group, int(counts[(job, optimizer)]))
            for (job, optimizer, _), group in finals.groupby(["job_id", "optimizer", "status"], sort=False)]
    summary = pd.DataFrame(rows)
    return summary.join(relative_columns(finals, summary, margin))


def per_seed(trials: pd.DataFrame, optimizer: str, column: str = "eval_target") -> dict[int, float]:
    """{seed: value} of one optimizer's ok trials (a job's finals)."""
    rows = trials[(trials["optimizer"] == optimizer) & (trials["status"] == "ok") & trials[column].notna()]
    return dict(zip(rows["seed"].astype(int), rows[column].astype(float), strict=True))


def relative_columns(finals: pd.DataFrame, summary: pd.DataFrame, margin: float | None) -> pd.DataFrame:
    """Per job with ok reference rows: memory saved %, speed x and the paired target-metric difference with
    its verdict (in points for a metric in [0, 1], in % of the reference otherwise), indexed like `summary`; every
    row gets its job's scale and margin (None where no trial scored). No reference: nothing more. Built as one
    frame and joined once (setting cells one by one fragments the summary)."""
    cells: dict[Any, dict[str, Any]] = {}
    for job, every in summary.groupby("job_id", sort=False):
        trials = finals[finals["job_id"] == job]
        mode = str(every["target_mode"].iloc[0])
        scored = bool(trials["eval_target"].map(stats.is_finite).any())  # none (all failed): no scale, no margin
        scale = stats.scale_of(mode, trials["eval_target"]) if scored else None
        job_margin = None if not scored else stats.DEFAULT_MARGIN[scale] if margin is None else margin
        cells.update({index: {"target_scale": scale, "margin": job_margin} for index in every.index})
        rows = every[every["status"] == "ok"]
        ref = rows[rows["optimizer"] == REFERENCE_OPTIMIZER]
        if ref.empty:
            continue
        ref_row = ref.iloc[0]
        saved = 100 * (1 - rows[MEMORY_HEADLINE.column] / ref_row[MEMORY_HEADLINE.column])
        speed = ref_row[SPEED_HEADLINE.column] / rows[SPEED_HEADLINE.column]
        reference = per_seed(trials, REFERENCE_OPTIMIZER)
        for index, row in rows.iterrows():
            cells[index].update({MEM_SAVED: saved[index], SPEED: speed[index]})
            if row["optimizer"] != REFERENCE_OPTIMIZER:
                found = stats.paired_verdict(per_seed(trials, row["optimizer"]), reference, mode, job_margin, scale)
                cells[index].update(_verdict_cells(found, trials, (row, ref_row), scale))
    return pd.DataFrame.from_dict(cells, orient="index")


def _arm(trials: pd.DataFrame, optimizer: str) -> bounds.Arm:
    ok = trials[(trials["optimizer"] == optimizer) & (trials["status"] == "ok") & trials["eval_target"].notna()]
    return bounds.Arm(optimizer, ok["eval_target"].astype(float).tolist(), ok["eval_curve"].tolist(),
                      int(ok["steps"].max()) if len(ok) else 0)


def _verdict_cells(found: stats.Verdict | None, trials: pd.DataFrame, pair: tuple[pd.Series, pd.Series],
                   scale: str) -> dict[str, Any]:
    """The paired difference, its verdict (saturated where bounds.saturation says so) and the minimum detectable
    difference; a pair where either arm did not train gets no figure, only `untrained` — with the verdict *worse*
    where the candidate alone did not train and the reference did (a job at chance is worse than one that learned,
    which is a finding; its size is not)."""
    if found is None:
        return {}
    if any(untrained_row(row) for row in pair):
        candidate, reference = (untrained_row(row) for row in pair)
        if candidate and not reference and found.word == stats.WORSE:
            return {"delta_untrained": True, "verdict_vs_adamw": found.text, "verdict_word_vs_adamw": found.word}
        return {"delta_untrained": True}
    row = pair[0]
    mode = str(row["target_mode"])
    arms = [_arm(trials, str(side["optimizer"])) for side in pair]
    found = bounds.judged(found, arms, row.get("metric_ceiling"), row.get("eval_rows"), str(row["target_metric"]),
                          mode, scale)
    sign = 1.0 if mode == "max" else -1.0  # shown as the metric moves (perplexity up = worse)
    return {"delta_vs_adamw": sign * found.difference.mean, "delta_vs_adamw_ci": found.difference.half_width,
            "delta_vs_adamw_n": found.difference.n, "delta_unit": found.unit, "verdict_vs_adamw": found.text,
            "verdict_word_vs_adamw": found.word, "verdict_excludes_zero": found.excludes_zero,
            "detectable_vs_adamw": found.detectable}


def time_to_target_by_job(summary: pd.DataFrame) -> dict[str, dict[str, float | None]]:
    """Median time to target per job label and optimizer (inf: missed on half the seeds or more; None: the
    optimizer failed). Jobs where nobody reached the target, or without eval curves, rank nobody: left out."""
    times: dict[str, dict[str, float | None]] = {}
    for row in summary.itertuples():
        per_job = times.setdefault(row.job, {})
        value = getattr(row, "time_to_target_s", None)
        if row.status == "ok" or row.optimizer not in per_job:
            per_job[row.optimizer] = float(value) if value is not None and pd.notna(value) else None
    return {job: per_job for job, per_job in times.items() if any(stats.is_finite(t) for t in per_job.values())}
