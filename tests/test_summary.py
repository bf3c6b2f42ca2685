"""summary.py on constructed records: grouping by the job key, the study's tune and final records (new design
and schema 1), time to target with a missed seed, the columns against the reference, the side-by-side key."""

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest

from optbench.job.spec import PRESETS, STUDY_BUDGETS
from optbench.records.record import Record, read_records
from optbench.report.frame import MEM_SAVED, SPEED, summarize, time_to_target_by_job, trials_frame
from optbench.report.render import render_markdown, verdict_sentences

JOB = dict(model="m", dataset="d", device="cpu", steps=8, warmup_steps=2, batch_size=4, seq_len=8, workload="w")
GRID = [1e-4, 1e-3, 1e-2]
STUDY_FILE = Path(__file__).resolve().parents[1] / "results" / "cpu-2core" / "study.jsonl"


def _trial(optimizer, seed, acc=None, lr=1e-3, stage=None, val=None, curve=None, **fields):
    measured = dict(state_bytes=8 * 2**20, peak_rss_growth_bytes=100 * 2**20, step_time_median_s=0.1)
    record = Record(trial_id=f"{optimizer}-{stage}-{lr}-{seed}", optimizer=optimizer, seed=seed, lr=lr, stage=stage,
                    status="ok", state_precision="fp32", **{**JOB, **measured, **fields})
    if acc is not None:
        record.eval_metrics, record.eval_accuracy = {"accuracy": acc}, acc
    if val is not None:
        record.val_metrics, record.val_metric, record.val_rows = {"accuracy": val}, val, 400
    record.eval_curve = curve or []
    return record


def _study():
    """Tune at the finals' job over GRID (seed 0, val and eval metrics), finals at the chosen lr (seeds 1, 2)."""
    records = []
    for name, best in (("adamw", 1e-3), ("adamw8bit", 1e-2)):
        for lr in GRID:
            score = 0.90 if lr == best else 0.80  # 10 points apart: no near-tie
            records.append(_trial(name, 0, acc=score - 0.01, lr=lr, stage="tune", val=score))
        records += [_trial(name, seed, acc=0.89 + 0.01 * seed, lr=best, stage="final") for seed in (1, 2)]
    return records


def test_the_tune_record_at_the_chosen_lr_is_that_seeds_final():
    frame = trials_frame(_study())
    assert frame["job_id"].nunique() == 1  # tune and final share the job key
    finals = frame[frame["final"]]
    assert sorted(zip(finals["optimizer"], finals["seed"], finals["stage"], strict=True)) == [
        ("adamw", 0, "tune"), ("adamw", 1, "final"), ("adamw", 2, "final"),
        ("adamw8bit", 0, "tune"), ("adamw8bit", 1, "final"), ("adamw8bit", 2, "final")]
    summary = summarize(frame).set_index("optimizer")
    assert summary.loc["adamw8bit", "tuned_lr"] == 1e-2 and summary.loc["adamw8bit", "of_trials"] == 3
    assert summary.loc["adamw", "eval_target"] == pytest.approx((0.89 + 0.90 + 0.91) / 3)
    assert summary.loc["adamw", "tune_band_basis"] == "binomial error of 400 validation rows"


def test_plain_runs_at_two_lrs_of_one_job_are_not_pooled_as_seeds():
    """`run --lr 1e-3` then `run --lr 1e-2 --seeds 0,1` into one file: the table read "ok 3/3", the three trials
    of two lrs averaged with a ± as if they were seeds of one result. Now the latest setting's, and a warning."""
    records = [_trial("adamw", 0, acc=0.5, lr=1e-3), _trial("adamw", 0, acc=0.8, lr=1e-2),
               _trial("adamw", 1, acc=0.82, lr=1e-2), _trial("sgd", 0, acc=0.6, lr=1e-2)]
    with pytest.warns(UserWarning, match=r"adamw ran at lr 0.001 and at lr 0.01 in one job .* the tables show its "
                                         r"latest setting, lr 0.01; the other 1 trial\(s\) are left out"):
        summary = summarize(trials_frame(records)).set_index("optimizer")
    assert summary.loc["adamw", "of_trials"] == 2 and summary.loc["adamw", "eval_target"] == pytest.approx(0.81)
    kwargs = [_trial("sgd", 0, acc=0.6), dataclasses.replace(_trial("sgd", 0, acc=0.7), trial_id="sgd-m",
                                                             optimizer_kwargs={"momentum": 0.9})]
    with pytest.warns(UserWarning, match=r'sgd ran at lr 0.001 and at lr 0.001 \{"momentum": 0.9\}'):
        assert summarize(trials_frame(kwargs)).set_index("optimizer").loc["sgd", "eval_target"] == 0.7


def test_finals_at_another_lr_than_the_tune_choice_say_so_in_the_tuned_lr_cell():
    """Studies of one job into one file: the tune trials pool (the choice stays adamw's 1e-3) while the table shows
    the latest finals, run at 1e-2 by a later study. The cell said "0.001" over figures of lr 0.01."""
    records = _study() + [_trial("adamw", seed, acc=0.7, lr=1e-2, stage="final") for seed in (1, 2)]
    with pytest.warns(UserWarning, match="latest setting, lr 0.01"):
        summary = summarize(trials_frame(records))
    markdown = render_markdown(summary)
    assert "| 0.01 (the finals' lr; the tune stage chose 0.001)" in markdown
    assert "| 0.01 " in markdown.split("adamw8bit")[1]  # adamw8bit's finals ran at its choice: the plain cell


def test_a_study_whose_tune_trials_all_failed_shows_them_not_an_empty_report():
    """Every tune trial timed out, so no final ran: the report was one blank line. An optimizer whose tuning all
    failed now shows its tune trials' status; one that tuned keeps its finals, and no lr-choice sentence is made
    from a tuning that chose nothing."""
    failed = [dataclasses.replace(_trial("sgd", 0, lr=lr, stage="tune"), status="timeout", error="timed out after 1 s")
              for lr in GRID]
    markdown = render_markdown(summarize(trials_frame(failed)))
    assert "| sgd " in markdown and "timeout 3/3" in markdown and "sgd (timeout): timed out after 1 s" in markdown
    assert "lr chosen by" not in markdown
    mixed = summarize(trials_frame(_study() + failed)).set_index("optimizer")
    assert mixed.loc["sgd", "status"] == "timeout" and mixed.loc["adamw", "of_trials"] == 3
    assert "lr chosen by" in render_markdown(mixed.reset_index())


def test_the_chance_note_is_said_when_the_first_row_failed_and_names_the_rule():
    """A failed first row (no chance figure) dropped the note while the ok rows below said `untrained`; and the
    note said "within 2 points of it" of a rule that also marks scores far below chance."""
    failed = dataclasses.replace(_trial("adamw", 0), status="oom", error="MemoryError")
    at_chance = _trial("sgd", 0, acc=0.1875, metric_chance=0.4375)
    markdown = render_markdown(summarize(trials_frame([failed, at_chance])))
    assert "untrained" in markdown.split("| sgd")[1].splitlines()[0]
    assert "chance: accuracy 0.4375 (the majority class's share); a final at most 2 points above it is shown as " \
           "untrained" in markdown


def test_before_the_finals_ran_the_chosen_lr_alone_is_the_final():
    frame = trials_frame([r for r in _study() if r.stage == "tune"])
    assert sorted(frame.loc[frame["final"], "lr"]) == [1e-3, 1e-2]


def _schema1(optimizer, stage, steps, lr, seed=0, **fields):
    return Record.from_dict({"schema_version": 1, "trial_id": f"{optimizer}-{stage}-{lr}-{seed}", "status": "ok",
                             "optimizer": optimizer, "stage": stage, "seed": seed, "lr": lr,
                             **{**JOB, "steps": steps}, **fields})


def test_schema1_tune_records_join_their_finals_job_without_the_step_count():
    records = [_schema1("adamw", "tune", 4, lr, val_metric=v) for lr, v in zip(GRID, [0.6, 0.9, 0.7], strict=True)]
    records += [_schema1("adamw", "final", 8, 1e-3, seed=s, eval_accuracy=0.9, eval_metrics={"accuracy": 0.9})
                for s in (0, 1)]
    frame = trials_frame(records)
    assert frame["job_id"].nunique() == 1 and not frame.loc[frame["stage"] == "tune", "final"].any()
    row = summarize(frame).iloc[0]
    assert (row["tuned_lr"], row["tune_steps"], row["of_trials"], row["schedule"]) == (1e-3, 4, 2, "constant")
    assert "of 4 steps (fewer than the 8 final steps)" in render_markdown(summarize(frame))


@pytest.mark.skipif(not STUDY_FILE.is_file(), reason="the reference study is not in this checkout")
def test_the_committed_study_chooses_the_lrs_its_finals_ran_at():
    """Recomputed from the records alone (as a resumed study does): the choice is the lr the finals ran at, tuned
    at the finals' own horizon."""
    frame = trials_frame(read_records(STUDY_FILE))
    summary = summarize(frame).set_index("optimizer")
    finals = frame[frame["stage"] == "final"].groupby("optimizer")["lr"].first()
    assert summary["tuned_lr"].to_dict() == pytest.approx(finals.to_dict())
    seeds = len(STUDY_BUDGETS["study"].seeds)
    steps = PRESETS["study"].steps
    assert set(summary["of_trials"]) == {seeds} and set(summary["tune_steps"]) == set(frame["steps"]) == {steps}


def test_side_by_side_groups_by_key_and_twin_labels_are_told_apart():
    plain = [_trial("adamw", 0, acc=0.9), _trial("adamw8bit", 0, acc=0.9)]
    bf16 = [dataclasses.replace(r, trial_id=r.trial_id + "b", precision="bf16") for r in plain]
    trainer = [dataclasses.replace(r, trial_id=r.trial_id + "t", engine="trainer") for r in plain]
    longer = [dataclasses.replace(r, trial_id=r.trial_id + "l", steps=16) for r in plain]
    warm = [dataclasses.replace(r, trial_id=r.trial_id + "w", warmup_steps=5) for r in plain]
    summary = summarize(trials_frame(plain + bf16 + trainer + longer + warm))
    sides = summary.groupby("side_id")["job_id"].nunique().sort_values().tolist()
    assert sides == [1, 1, 3]  # {16 steps}, {warm-up 5}, {fp32, bf16, trainer}: only precision and engine may differ
    labels = sorted(summary.loc[summary["warmup_steps"].isin([2, 5]) & (summary["steps"] == 8)
                                & (summary["weight_precision"] == "fp32") & (summary["engine"] == "native"), "job"]
                    .unique())
    assert labels == ["m on d, cpu, 8 steps x batch 4 x seq 8, linear lr (warmup_steps 2)",
                      "m on d, cpu, 8 steps x batch 4 x seq 8, linear lr (warmup_steps 5)"]


def test_a_job_without_the_reference_gets_no_relative_columns():
    summary = summarize(trials_frame([_trial("adafactor", s, acc=0.8) for s in (0, 1)]))
    for column in (MEM_SAVED, SPEED, "delta_vs_adamw", "verdict_vs_adamw"):
        assert column not in summary or summary[column].isna().all()


def test_relative_columns_and_the_margin():
    records = [_trial("adamw", s, acc=a) for s, a in enumerate([0.80, 0.82, 0.84])]
    records += [_trial("adamw8bit", s, acc=a + 0.02, peak_rss_growth_bytes=75 * 2**20, step_time_median_s=0.2)
                for s, a in enumerate([0.80, 0.821, 0.839])]
    summary = summarize(trials_frame(records)).set_index("optimizer")
    row = summary.loc["adamw8bit"]
    assert row[MEM_SAVED] == pytest.approx(25.0) and row[SPEED] == pytest.approx(0.5)
    assert row["delta_vs_adamw"] == pytest.approx(2.0) and row["delta_unit"] == "pts"
    assert row["verdict_vs_adamw"] == "better by at least 1 pt"
    wide = summarize(trials_frame(records), margin=5.0).set_index("optimizer").loc["adamw8bit"]
    assert wide["verdict_vs_adamw"] == "equivalent within ±5 pts" and wide["margin"] == 5.0


def test_a_job_where_no_trial_scored_states_no_scale_or_margin():
    # every trial failed (oom): a scale read from no values said "relative" and a 2 % margin nothing was held to
    records = [dataclasses.replace(_trial(name, 0), status="oom", error="MemoryError")
               for name in ("adamw", "adafactor")]
    summary = summarize(trials_frame(records))
    assert summary["target_scale"].isna().all() and summary["margin"].isna().all()
    assert "margin" not in render_markdown(summary)


def test_perplexity_difference_is_shown_in_percent_as_it_moves():
    lm = dict(target_metric="perplexity", target_mode="min")
    records = [_trial(name, s, **lm, eval_metrics={"perplexity": ppl * f})
               for name, f in (("adamw", 1.0), ("adamw8bit", 1.1)) for s, ppl in enumerate([20.0, 22.0, 21.0])]
    row = summarize(trials_frame(records)).set_index("optimizer").loc["adamw8bit"]
    assert row["delta_vs_adamw"] == pytest.approx(10.0) and row["delta_unit"] == "%"  # 10 % higher perplexity
    assert row["verdict_vs_adamw"] == "worse by at least 2 %" and row["target_scale"] == "relative"


def _curve(seconds_to_hit):
    """An eval curve that reaches 0.9 exactly at `seconds_to_hit` (never when None)."""
    if seconds_to_hit is None:
        return [[1, 1.0, 0.5], [2, 2.0, 0.6]]
    return [[1, seconds_to_hit / 2, 0.5], [2, seconds_to_hit, 0.9], [3, 1.5 * seconds_to_hit, 0.95]]


def _raced(times, target_value=0.9):
    return [_trial(name, seed, acc=0.95, curve=_curve(t), target_value=target_value)
            for name, per_seed in times.items() for seed, t in enumerate(per_seed)]


def test_one_seed_missing_the_target_counts_as_infinite_and_is_never_called_first():
    # "quick" reaches at 1 s and 3 s and misses once: median 3 s (not the mean 2 s of the seeds that got there),
    # slower than "steady" at 2.5 s on every seed.
    summary = summarize(trials_frame(_raced({"quick": [1.0, 3.0, None], "steady": [2.5, 2.5, 2.5]})))
    fast = summary.set_index("optimizer").loc["quick"]
    assert (fast["time_to_target_s"], fast["time_to_target_s_reached"], fast["time_to_target_s_n"]) == (3.0, 2, 3)
    assert "3.0 (reached 2/3; curve every 1.0)" in render_markdown(summary)
    assert "first to the target on every seed: steady (median 2.5 s)" in verdict_sentences(summary)
    # its median is the fastest here, but it missed a seed: still never called first
    summary = summarize(trials_frame(_raced({"quick": [1.0, 1.0, None], "steady": [2.5, 2.5, 2.5]})))
    assert "first to the target on every seed: steady (median 2.5 s)" in verdict_sentences(summary)
    assert not any("first" in line and "quick" in line for line in verdict_sentences(summary))


def test_the_profile_takes_each_jobs_median_with_misses_as_infinite():
    job_a = _raced({"quick": [1.0, 3.0, None], "steady": [2.5, 2.5, 2.5]})
    job_b = [dataclasses.replace(r, trial_id=r.trial_id + "b", steps=16)
             for r in _raced({"quick": [1.0, None, None], "steady": [2.0, 2.0, 2.0]})]
    times = time_to_target_by_job(summarize(trials_frame(job_a + job_b)))
    assert sorted(times.values(), key=lambda t: t["steady"]) == [{"quick": math.inf, "steady": 2.0},
                                                                {"quick": 3.0, "steady": 2.5}]
    markdown = render_markdown(summarize(trials_frame(job_a + job_b)))
    profile = markdown.split("performance profile")[1]
    assert "| steady      |                 1     | 2/2 " in profile and "| quick       " in profile
    assert "| 1/2 " in profile  # quick missed job b on the median


def test_failed_trials_keep_their_rows_and_error():
    failed = dataclasses.replace(_trial("adafactor", 0), status="diverged", error="loss became nan")
    summary = summarize(trials_frame([_trial("adamw", 0, acc=0.9), failed]))
    row = summary.set_index("optimizer").loc["adafactor"]
    assert (row["status"], row["error"], row["trials"]) == ("diverged", "loss became nan", 1)
    assert pd.isna(row.get("eval_target"))


def test_no_optimizer_is_first_to_a_target_by_less_than_the_curves_resolution():
    """Curves evaluated every 1.25 s (2.5 / 2) cannot tell 2.4 s from 2.5 s: neither is called first."""
    close = summarize(trials_frame(_raced({"a": [2.4, 2.4, 2.4], "b": [2.5, 2.5, 2.5]})))
    said = verdict_sentences(close)
    assert "no first to the target: a, b reach it within the eval curve's 1.2 s resolution" in said
    assert not any(line.startswith("first to the target") for line in said)
    apart = summarize(trials_frame(_raced({"a": [1.0, 1.0, 1.0], "b": [2.5, 2.5, 2.5]})))
    assert "first to the target on every seed: a (median 1.0 s)" in verdict_sentences(apart)
