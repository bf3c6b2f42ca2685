"""The study command: tune at the finals' job, choose from the records, add the other seeds, kill-and-rerun.
Fake trials keep these fast; one end-to-end run on the tiny workload checks the real trials carry both splits.
The lr choice itself (noise band, ties) is tested with the analysis core in test_stats.py."""

import math
from collections.abc import Callable

import pytest

from optbench import optimizers
from optbench.__main__ import main
from optbench.job.spec import StudyBudget, TrialSpec
from optbench.records.record import Record, read_records
from optbench.report import stats
from optbench.workflows import study

SETTINGS = dict(workload="tiny", steps=6, warmup_steps=1, batch_size=4, seq_len=16, eval_size=32, device="cpu",
                eval_every=2)
BEST_LR = {"adamw": 1e-4, "adafactor": 1e-3}
GRIDS = {"adamw": [1e-5, 1e-4, 1e-3, 1e-2], "adafactor": [1e-4, 1e-3, 1e-2, 1e-1]}


def fake_trial(spec: TrialSpec) -> Record:
    """Validation and eval accuracy peak at BEST_LR (log distance); adafactor diverges at its largest lr. Every
    study trial is scored on both splits, as the real ones are."""
    record = Record(trial_id=spec.trial_id, status="ok", optimizer=spec.optimizer, seed=spec.seed,
                    workload=spec.workload, steps=spec.steps, lr=spec.lr, stage=spec.stage, val_rows=400,
                    target_value=spec.target)
    score = 0.9 - 0.1 * abs(math.log10(spec.lr / BEST_LR[spec.optimizer]))
    if spec.optimizer == "adafactor" and spec.lr > 1e-2:
        record.status, record.error = "diverged", "loss became nan"
        return record
    record.val_metrics = {"accuracy": score}
    record.val_metric = record.val_accuracy = score
    value = score + 0.01 * spec.seed
    record.eval_metrics, record.eval_accuracy = {"accuracy": value}, value
    record.eval_curve = [[2, 1.0, value - 0.2], [4, 2.0, value - 0.05], [6, 3.0, value]]
    return record


def _run(out, run_trial=fake_trial, tune_seeds=(0,), seeds=(0, 1, 2), search="grid"):
    lines = []
    budget = StudyBudget(lr_points=4, eval_every=2, tune_seeds=tune_seeds, seeds=seeds, search=search)
    result = study.run_study(["adamw", "adafactor"], SETTINGS, budget, out, grids=GRIDS, run_trial=run_trial,
                             show=lines.append)
    return result, lines


def test_grid_comes_from_the_registry_range_with_the_default_in_it():
    entry = optimizers.resolve("adamw")
    grid = study.lr_grid("adamw", 4)
    assert len(grid) == 4 and grid == sorted(grid) and entry.default_lr in grid
    assert entry.lr_range[0] <= grid[0] and grid[-1] <= entry.lr_range[1]


def test_study_tunes_at_the_finals_job_and_then_adds_only_the_other_seeds(tmp_path):
    out = tmp_path / "study.jsonl"
    result, lines = _run(out)
    assert {c.optimizer: c.lr for c in result.choices} == BEST_LR
    records = read_records(out)
    tune = [r for r in records if r.stage == "tune"]
    final = [r for r in records if r.stage == "final"]
    assert len(tune) == 8 and {r.seed for r in tune} == {0}
    # the tune trial at the chosen lr is seed 0's final: the final stage runs seeds 1 and 2 only
    assert sorted((r.optimizer, r.seed, r.lr) for r in final) == sorted(
        (name, seed, lr) for name, lr in BEST_LR.items() for seed in (1, 2))
    assert {(s.steps, s.eval_every, s.schedule) for s in result.tune + result.final} == {(6, 2, "linear")}
    assert [r.status for r in tune].count("diverged") == 1
    assert lines[0].startswith("[1/12] ") and "; ETA " in lines[0] and lines[-1].startswith("[12/12] ")
    assert lines[-1].endswith("; done")
    adafactor = next(c for c in result.choices if c.optimizer == "adafactor")
    assert [p.status for p in adafactor.points][-1] == "diverged"


def test_the_time_to_target_threshold_is_fixed_from_the_tune_stage_before_the_finals(tmp_path, capsys):
    from optbench.report.frame import fixed_targets, job_targets, trials_frame

    out = tmp_path / "study.jsonl"
    result, _ = _run(out)
    target = 0.95 * 0.9  # 0.95 x adamw's best validation score in the tune stage (at its best lr)
    assert all(s.target == pytest.approx(target) for s in result.final) and result.final
    assert all(s.target is None for s in result.tune)  # they ran before it was known
    frame = trials_frame(read_records(out))
    assert list(job_targets(frame).values()) == [pytest.approx(target)] and all(fixed_targets(frame).values())
    assert "time-to-target threshold accuracy 0.855, fixed before the finals" in capsys.readouterr().err
    given = study.run_study(["adamw"], {**SETTINGS, "target": 0.5}, StudyBudget(lr_points=4, eval_every=2,
                            search="grid"), tmp_path / "given.jsonl", grids=GRIDS, run_trial=fake_trial,
                            show=lambda line: None)
    assert {s.target for s in given.final} == {0.5}  # --target wins


def test_a_tune_stage_at_chance_fixes_no_target_and_no_optimizer_is_first_to_one(tmp_path, capsys):
    """0.95 x a validation score a constant guess makes lies where every curve starts: no threshold is fixed, the
    report's after-the-fact one is taken from trained trials only, and an optimizer at chance is never first."""
    from optbench.report import render
    from optbench.report.frame import job_targets, summarize, trials_frame

    def at_chance(spec: TrialSpec) -> Record:
        record = fake_trial(spec)
        record.metric_chance = 0.91  # every score of fake_trial (at most 0.92) is within 2 points of it: untrained
        return record

    out = tmp_path / "study.jsonl"
    result, _ = _run(out, at_chance)
    assert result.final and all(s.target is None for s in result.final)
    err = capsys.readouterr().err
    assert "no time-to-target threshold fixed: adamw's best validation accuracy in the tune stage, 0.9, is at " \
           "chance (0.91): the tune stage did not train" in err and "fixed before the finals" not in err
    assert job_targets(trials_frame(read_records(out))) == {}  # nor one after the fact from finals at chance
    # a --target the curves at chance cross: timed, but no optimizer at chance is called first to it
    given = tmp_path / "given.jsonl"
    study.run_study(["adamw", "adafactor"], {**SETTINGS, "target": 0.5}, StudyBudget(lr_points=4, eval_every=2,
                    search="grid"), given, grids=GRIDS, run_trial=at_chance, show=lambda line: None)
    summary = summarize(trials_frame(read_records(given)))
    assert summary["time_to_target_s"].notna().all()
    assert not any("first to the target" in line for line in render.verdict_sentences(summary))


def _with_chances(eval_chance: float, val_chance: float) -> Callable[[TrialSpec], Record]:
    """The fake trial, its eval and validation splits' chance levels set apart."""
    def run_trial(spec: TrialSpec) -> Record:
        record = fake_trial(spec)
        record.metric_chance, record.val_chance = eval_chance, val_chance
        return record
    return run_trial


def test_the_tune_stage_is_judged_against_the_validation_splits_chance_not_the_eval_splits(tmp_path, capsys):
    """The tune stage scores validation rows: a best of 0.9 where the validation split's majority class is 0.91 did
    not train, whatever the eval split's chance (0.5 here) says."""
    result, _ = _run(tmp_path / "study.jsonl", _with_chances(eval_chance=0.5, val_chance=0.91))
    assert result.final and all(s.target is None for s in result.final)
    assert "is at chance (0.91): the tune stage did not train" in capsys.readouterr().err


def test_a_target_at_the_eval_splits_chance_is_not_fixed(tmp_path, capsys):
    """A tune best of 0.9 that trained on validation (chance 0.5) gives 0.95 x 0.9 = 0.855, which an eval split
    whose majority class is 0.86 reaches before any step: no target, and the running lines judge each split
    against its own chance (val trained, eval untrained)."""
    result, lines = _run(tmp_path / "study.jsonl", _with_chances(eval_chance=0.86, val_chance=0.5))
    assert result.final and all(s.target is None for s in result.final)
    assert "0.855, is at chance on the eval split the curves are scored on (0.86)" in capsys.readouterr().err
    assert any("adamw tune lr=1e-05 seed=0 ok" in line and "(val 0.8, eval untrained)" in line for line in lines)


def test_two_tune_seeds_tune_every_lr_twice_and_leave_one_final_seed(tmp_path):
    result, _ = _run(tmp_path / "study.jsonl", tune_seeds=(0, 1))
    assert len(result.tune) == 16 and {s.seed for s in result.final} == {2} and len(result.final) == 2
    assert all(c.tune_seeds == 2 for c in result.choices)


def test_kill_and_rerun_skips_ok_trials_and_reaches_the_same_choice(tmp_path):
    out = tmp_path / "study.jsonl"
    calls = []

    def dies_after_five(spec):
        if len(calls) == 5:
            raise KeyboardInterrupt
        calls.append(spec.trial_id)
        return fake_trial(spec)

    with pytest.raises(KeyboardInterrupt):
        _run(out, dies_after_five)
    assert len(read_records(out)) == 5
    rerun = []
    result, _ = _run(out, lambda spec: rerun.append(spec.trial_id) or fake_trial(spec))
    assert set(rerun).isdisjoint(calls) and len(rerun) == 12 - 5
    assert {c.optimizer: c.lr for c in result.choices} == BEST_LR
    again = []
    _, lines = _run(out, lambda spec: again.append(spec) or fake_trial(spec))
    assert sum("already ok" in line for line in lines) == 11 and lines[-1].startswith("[12/12]")
    assert [(s.optimizer, s.lr) for s in again] == [("adafactor", 1e-1)]  # only the diverged point re-runs


def test_a_walk_finds_the_grids_choice_without_the_far_ends(tmp_path):
    """Neither default lr is in GRIDS, so each walk starts at its grid's middle point (1e-4, 1e-3), goes up one
    point (worse), then down one (worse) and stops: adafactor's diverging 1e-1 and adamw's 1e-2 never run."""
    out = tmp_path / "study.jsonl"
    ran = []
    result, lines = _run(out, lambda spec: ran.append(spec) or fake_trial(spec), search="walk")
    assert {c.optimizer: c.lr for c in result.choices} == BEST_LR
    tuned = [(s.optimizer, s.lr) for s in ran if s.stage == "tune"]
    assert tuned == [("adamw", 1e-4), ("adafactor", 1e-3), ("adamw", 1e-3), ("adafactor", 1e-2),
                     ("adamw", 1e-5), ("adafactor", 1e-4)]
    assert len(ran) == 6 + 4 and lines[-1].startswith("[10/10] ")
    assert sorted((s.optimizer, s.lr) for s in result.tune) == sorted(tuned)  # the trials run, not the whole grid
    assert all(len(c.points) == 3 and c.tunability == pytest.approx(1 / 3) for c in result.choices)
    grid, _ = _run(tmp_path / "grid.jsonl")
    assert {c.optimizer: c.lr for c in grid.choices} == BEST_LR


def test_a_killed_walk_reruns_to_the_same_trials_and_choice(tmp_path):
    out = tmp_path / "study.jsonl"
    calls = []

    def dies_after_three(spec):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(spec)
        return fake_trial(spec)

    with pytest.raises(KeyboardInterrupt):
        _run(out, dies_after_three, search="walk")
    rerun = []
    result, _ = _run(out, lambda spec: rerun.append(spec) or fake_trial(spec), search="walk")
    assert {s.trial_id for s in rerun}.isdisjoint(s.trial_id for s in calls) and len(calls) + len(rerun) == 10
    assert {c.optimizer: c.lr for c in result.choices} == BEST_LR


def _peaked_at(best: dict[str, float]):
    """A fake trial whose validation accuracy peaks at `best` (which may lie past the grid), carrying its lr source
    as real trials do."""
    def trial(spec: TrialSpec) -> Record:
        record = fake_trial(spec)
        record.lr_source = spec.lr_source
        if record.status == "ok":
            score = 0.9 - 0.1 * abs(math.log10(spec.lr / best[spec.optimizer]))
            record.val_metrics, record.val_metric = {"accuracy": score}, score
        return record
    return trial


@pytest.mark.parametrize(("best", "chosen", "note"), [
    (2e-2, 1e-2, "extended"),  # the step past 1e-2 (1e-1) is worse: 1e-2 is bracketed
    (1e-1, 1e-1, "extended, edge"),  # the step past is the best: the optimum may lie further out, and it says so
])
def test_an_edge_choice_extends_the_walk_one_grid_point(tmp_path, best, chosen, note):
    from optbench.report import tuning
    from optbench.report.frame import summarize, trials_frame

    out, ran = tmp_path / "study.jsonl", []
    trial = _peaked_at({"adamw": best, "adafactor": 1e-3})
    result, lines = _run(out, lambda spec: ran.append(spec) or trial(spec), search="walk")
    extended = [(s.optimizer, s.lr) for s in ran if s.lr_source == tuning.EXTENDED]
    assert extended == [("adamw", 1e-1)]  # one grid step (x10 on this grid) past its top; adafactor's best is inside
    assert lines[-1].startswith(f"[{len(ran)}/{len(ran)}] ")  # the progress count includes the extension
    assert {c.optimizer: c.lr for c in result.choices} == {"adamw": chosen, "adafactor": 1e-3}
    summary = summarize(trials_frame(read_records(out))).set_index("optimizer")
    assert summary.loc["adamw", "tune_range"] == note and summary.loc["adafactor", "tune_range"] == ""
    again = []
    _run(out, lambda spec: again.append(spec) or trial(spec), search="walk")
    assert again == []  # a rerun retraces the extension from the records: nothing new runs


def test_step_past_a_grid_is_its_mean_log_spacing():
    from optbench.report import tuning

    assert tuning.step_past([1e-5, 5e-5, 3e-4], upward=True) == 1.64e-3  # 3e-4 x sqrt(30)
    assert tuning.step_past([3e-5, 3e-4, 3e-3], upward=False) == 3e-6
    assert study.extension([1e-4], _choice({1e-4: 0.9})) is None  # a grid of one lr (--lr) is the user's


def _choice(values: dict[float, float | None], band: float = 0.02) -> stats.LrChoice:
    points = [stats.LrPoint(lr, "ok" if v is not None else "diverged", v, (v,) if v is not None else ())
              for lr, v in values.items()]
    return stats.LrChoice("adamw", points, "accuracy", "max", 10, band=band)


@pytest.mark.parametrize(("tried", "expected"), [
    ({}, 1e-3),                                     # nothing tried: the start
    ({1e-3: 0.9}, 1e-2),                            # the start is the best so far: up
    ({1e-3: 0.9, 1e-2: 0.89}, 1e-1),                # still within the band of the best: up again
    ({1e-3: 0.9, 1e-2: 0.7}, 1e-4),                 # up was worse: down
    ({1e-4: 0.7, 1e-3: 0.9, 1e-2: 0.7}, None),      # both sides worse: done
    ({1e-3: 0.7, 1e-2: 0.9, 1e-1: 0.95}, None),     # the top of the grid is the best; the bottom is out: done
    ({1e-3: None}, 1e-4),                           # the start failed: a smaller lr first
    ({1e-5: None, 1e-4: None, 1e-3: None}, 1e-2),   # nothing below works: up
])
def test_next_on_walk(tried, expected):
    grid = [1e-5, 1e-4, 1e-3, 1e-2, 1e-1]
    assert study.next_on_walk(grid, _choice(tried), start=1e-3) == expected


def test_a_walk_starts_at_the_registry_default_where_the_grid_holds_it():
    assert study.walk_start([1e-5, 5e-5, 3e-4], 5e-5) == 5e-5
    assert study.walk_start([1e-5, 1e-4, 1e-3, 1e-2], 5e-5) == 1e-4


@pytest.mark.parametrize("argv", [["study", "--lr-grid", "1e-4,abc"], ["study", "--lr-grid", "0"],
                                  ["study", "--optimizers", "nope"], ["study", "--seeds", ","],
                                  ["study", "--tune-seeds", ","], ["study", "--schedule", "step"]])
def test_study_bad_input_is_one_line_and_exit_2(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("optbench.workflows.study.run_study",
                        lambda *a, **k: pytest.fail("bad input reached the trials"))
    assert main(argv + ["--out", str(tmp_path / "r.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("optbench: error:") and err.count("\n") == 1


def test_study_end_to_end_with_run_job_flags(tmp_path, capsys):
    """Real trials: the job flags of `run` reach a study's trials, and each trial is scored on both splits."""
    out = tmp_path / "study.jsonl"
    code = main(["study", "--preset", "smoke", "--workload", "tiny", "--optimizers", "adamw", "--device", "cpu",
                 "--batch-size", "4", "--seq-len", "16", "--schedule", "cosine", "--margin", "2", "--no-figures",
                 "--out", str(out),
                 "--seeds", "0,1", "--lr-grid", "1e-2"])  # 2 trials: the tune trial (seed 0) and seed 1's final
    assert code == 0
    records = read_records(out)
    assert sorted((r.stage, r.seed) for r in records) == [("final", 1), ("tune", 0)]
    assert all(r.status == "ok" and r.val_metric is not None and r.eval_metrics and r.eval_curve for r in records)
    assert {(r.batch_size, r.seq_len, r.schedule) for r in records} == {(4, 16, "cosine")}
    printed = capsys.readouterr().out
    assert "±" in printed and max(map(len, printed.splitlines())) <= 120


def test_an_interrupted_study_counts_every_record_it_made_not_the_last_rounds(tmp_path, monkeypatch, capsys):
    """A study is several sweeps (tune rounds, then finals); Ctrl-C in a later one said "interrupted: 0 trials
    recorded" though the earlier rounds had recorded theirs (the count was the interrupted sweep's alone)."""
    from _tiny import TINY_ARGS

    from optbench.cli import study as study_cli
    from optbench.records.record import append_record
    from optbench.sweep import SweepInterrupted

    out = tmp_path / "s.jsonl"
    append_record(out, Record(trial_id="before", optimizer="adamw", status="ok"))  # an earlier command's

    def two_rounds(*args):
        for n in range(3):
            append_record(out, Record(trial_id=f"round-1-{n}", optimizer="adamw", status="ok"))
        raise SweepInterrupted(0)  # the second round's sweep had recorded nothing yet

    monkeypatch.setattr(study_cli, "_run", two_rounds)
    assert main(["study", *TINY_ARGS, "--out", str(out)]) == 130
    assert "interrupted: 3 trials recorded" in capsys.readouterr().err
