"""The analysis core pinned on hand-computed numbers: intervals (t quantiles from a printed table), the five
verdict words on constructed paired data, time to target with a missed seed, the Pareto front, the
performance profile, and the study's lr choice with its noise-derived near-tie band."""

import math

import pytest

from optbench.records.record import Record
from optbench.report import pareto, stats


@pytest.mark.parametrize(("n", "expected"), [(2, 12.7062), (3, 4.3027), (5, 2.7764), (11, 2.2281)])
def test_t_quantile_matches_the_printed_table(n, expected):
    assert stats.t_quantile(n) == pytest.approx(expected, abs=1e-4)


def test_mean_ci_three_seeds_by_hand():
    interval = stats.mean_ci([0.80, 0.82, 0.84])
    # s = 0.02, sem = 0.02 / sqrt(3), t(0.975, 2) = 4.3027
    assert interval.mean == pytest.approx(0.82)
    assert interval.half_width == pytest.approx(4.302653 * 0.02 / math.sqrt(3), rel=1e-5)
    assert interval.n == 3
    assert interval.text(3) == "0.820 ± 0.050 (n=3)"


def test_one_seed_has_no_interval_not_zero():
    interval = stats.mean_ci([0.7])
    assert interval.half_width is None and interval.n == 1 and interval.low is None
    assert interval.text() == "0.700 ± n/a (n=1)"
    assert stats.mean_ci([None, float("nan")]) is None


# --- verdicts ------------------------------------------------------------------------------------------

REF = {0: 0.80, 1: 0.82, 2: 0.84}


def _shifted(points):
    """REF moved by the given points (0.01 each) per seed."""
    return {seed: REF[seed] + p / 100 for seed, p in zip(REF, points, strict=True)}


@pytest.mark.parametrize("points,word,text", [
    ([0.1, -0.1, 0.0], stats.EQUIVALENT, "equivalent within ±1 pt"),  # CI ±0.25: inside (-1, +1)
    ([3.0, 3.2, 2.8], stats.BETTER, "better by at least 1 pt"),  # 3.0 ± 0.50: above +1
    ([-3.0, -3.2, -2.8], stats.WORSE, "worse by at least 1 pt"),  # -3.0 ± 0.50: below -1
    ([0.5, 1.5, 1.0], stats.NON_INFERIOR, "non-inferior (at most 1 pt worse)"),  # 1.0 ± 1.24: above -1, past +1
    ([-2.0, 1.0, 0.5], stats.INCONCLUSIVE, "inconclusive (about 17 seeds would settle it)"),  # -0.17 ± 3.99
])
def test_each_verdict_word_from_constructed_pairs(points, word, text):
    verdict = stats.paired_verdict(_shifted(points), REF, "max")
    assert (verdict.word, verdict.text, verdict.unit) == (word, text, "pts")
    assert verdict.difference.n == 3 and verdict.difference.mean == pytest.approx(sum(points) / 3)


def test_seeds_to_settle_by_hand():
    """-2, 1, 0.5 points: mean -1/6, s = 1.6073; the CI must clear -1, i.e. a half-width below 0.833:
    t(15) 2.131 x 1.6073 / 4 = 0.856 does not, t(16) 2.120 x 1.6073 / sqrt(17) = 0.826 does."""
    assert stats.seeds_to_settle(-1 / 6, 1.6073, 1.0) == 17
    assert stats.seeds_to_settle(-3.0, 0.0, 1.0) == 2  # no spread: the next seed settles it
    assert stats.seeds_to_settle(-1.0, 1.0, 1.0) is None  # sitting on -m: no number of seeds decides it
    assert stats.seeds_to_settle(0.0, 100.0, 1.0) is None  # beyond MAX_SEEDS


def test_minimum_detectable_difference_by_hand():
    """m + (t(0.975, n-1) + t(0.8, n-1)) s / sqrt(n); printed t tables: t(0.975, 3) = 3.182, t(0.8, 3) = 0.978,
    t(0.975, 9) = 2.262, t(0.8, 9) = 0.883. n = 4, s = 0.5, m = 1: 1 + 4.160 x 0.25 = 2.040."""
    assert stats.minimum_detectable_difference(0.5, 4, 1.0) == pytest.approx(1 + (3.182 + 0.978) * 0.5 / 2, abs=2e-3)
    assert stats.minimum_detectable_difference(0.3, 10, 1.0) == pytest.approx(
        1 + (2.262 + 0.883) * 0.3 / math.sqrt(10), abs=2e-3)
    assert stats.minimum_detectable_difference(0.5, 1, 1.0) is None  # one seed: no interval, no power
    verdict = stats.paired_verdict(_shifted([-2.0, 1.0, 0.5]), REF, "max")  # s = 1.6073 points, n = 3
    assert verdict.detectable == pytest.approx(1 + (4.303 + 1.061) * 1.6073 / math.sqrt(3), abs=5e-3)


def test_a_difference_the_size_of_the_mdd_is_called_worse_in_about_80_percent_of_studies():
    """Simulated paired studies at n = 4 with normal differences of SD s, the true difference -MDD: the verdict
    says "worse by at least m" in ~80 % of them (what the minimum detectable difference means)."""
    import numpy as np

    rng = np.random.default_rng(0)
    sd, n, margin = 0.4, 4, 1.0
    true = -stats.minimum_detectable_difference(sd, n, margin)
    calls = [stats.verdict(list(rng.normal(true, sd, n)), margin).word == stats.WORSE for _ in range(4000)]
    assert 0.70 < sum(calls) / len(calls) < 0.90


def test_one_seed_and_no_shared_seed():
    assert stats.paired_verdict({0: 0.9}, {0: 0.8}, "max").text == "inconclusive (one seed: no interval)"
    assert stats.paired_verdict({5: 0.9}, {0: 0.8}, "max") is None


def test_min_metrics_are_read_in_percent_of_the_reference_and_oriented():
    ref = {0: 20.0, 1: 21.0, 2: 22.0, 3: 99.0}
    lower = stats.paired_verdict({0: 19.0, 1: 19.95, 2: 20.9}, ref, "min")  # 5 % lower perplexity each seed
    assert lower.difference.n == 3  # seed 3 has no partner
    assert (lower.word, lower.unit, lower.margin) == (stats.BETTER, "%", 2.0)  # default margin: 2 %
    assert lower.difference.mean == pytest.approx(5.0) and lower.text == "better by at least 2 %"
    higher = stats.paired_verdict({0: 21.0, 1: 22.05, 2: 23.1}, ref, "min", margin=10.0)
    assert higher.text == "equivalent within ±10 %" and higher.difference.mean == pytest.approx(-5.0)


def test_a_margin_changes_the_word_and_excluding_zero_is_reported():
    diffs = [1.5, 1.6, 1.4]  # 1.5 ± 0.25 points
    assert stats.verdict(diffs, 1.0).word == stats.BETTER
    wide = stats.verdict(diffs, 2.0)
    assert wide.text == "equivalent within ±2 pts" and wide.excludes_zero


# --- time to target, Pareto front, profile -------------------------------------------------------------

def test_time_to_target_counts_a_missed_seed_as_infinite():
    one_missed = stats.time_to_target([10.0, 30.0, math.inf])
    assert (one_missed.median, one_missed.reached, one_missed.n) == (30.0, 2, 3)  # not the mean 20 of those reached
    assert one_missed.text(0) == "30 (reached 2/3)" and not one_missed.everywhere
    most_missed = stats.time_to_target([10.0, math.inf, None])
    assert math.isinf(most_missed.median) and most_missed.text() == "missed (reached 1/3)"
    assert stats.time_to_target([float("nan")]) is None  # no curve is no seed
    spaced = stats.TimeToTarget(30.0, 3, 3, resolution=4.0)
    assert spaced.text(0) == "30 (reached 3/3; curve every 4)"


def test_a_crossing_is_interpolated_between_the_evaluations_around_it_and_their_spacing_is_its_resolution():
    up = stats.reached([[5, 1.0, 0.7], [10, 2.0, 0.9], [15, 3.0, 0.95]], 0.8, "max")  # halfway from 0.7 to 0.9
    assert (up.step, up.seconds, up.bracket_s) == pytest.approx((7.5, 1.5, 1.0))
    down = stats.reached([[5, 1.0, 9.0], [10, 3.0, 4.0]], 5.0, "min")  # 4/5 of the way down from 9 to 4
    assert (down.step, down.seconds, down.bracket_s) == pytest.approx((9.0, 2.6, 2.0))
    first = stats.reached([[5, 1.5, 0.95], [10, 3.0, 0.96]], 0.9, "max")  # nothing evaluated before: 0 to 1.5 s
    assert (first.step, first.seconds, first.bracket_s) == (5.0, 1.5, 1.5)
    assert stats.reached([[5, 1.0, None], [10, 2.0, 0.5]], 0.9, "max") is None


@pytest.mark.parametrize("memory,accuracy,front", [
    ([], [], []),
    ([3.0], [0.5], [0]),
    # (5, .80) loses to (5, .85); (20, .85) to (10, .90); the second (1, .50) repeats the first.
    ([10, 5, 5, 20, 1, 1], [0.90, 0.80, 0.85, 0.85, 0.50, 0.50], [4, 2, 0]),
    ([1, 2, 3], [0.9, 0.8, 0.7], [0]),  # more memory for less accuracy is never on the front
    ([1, 2, 3], [0.7, 0.8, 0.9], [0, 1, 2]),
])
def test_pareto_front(memory, accuracy, front):
    assert pareto.pareto_front(memory, accuracy) == front


def test_performance_profile_and_score():
    times = {"job a": {"adamw": 10.0, "adafactor": 20.0, "adamw8bit": None},
             "job b": {"adamw": 30.0, "adafactor": 15.0, "adamw8bit": 45.0},
             "job c": {"adamw": 5.0, "adafactor": math.inf, "adamw8bit": 5.0}}  # inf: the median missed
    taus = [1.0, 2.0, 3.0, 4.0]
    profile = pareto.performance_profile(times, taus)
    assert profile["adamw"] == pytest.approx([2 / 3, 1.0, 1.0, 1.0])
    assert profile["adafactor"] == pytest.approx([1 / 3, 2 / 3, 2 / 3, 2 / 3])
    assert profile["adamw8bit"] == pytest.approx([1 / 3, 1 / 3, 2 / 3, 2 / 3])
    assert pareto.profile_score([1.0] * 4, taus) == pytest.approx(1.0)
    assert pareto.profile_score([0.5, 1.0, 1.0, 1.0], taus) == pytest.approx((0.75 + 1 + 1) / 3)


# --- the lr choice -------------------------------------------------------------------------------------

GRID = [1e-5, 1e-4, 1e-3, 1e-2, 1e-1]  # geometric middle 1e-3


def _tune(values_by_seed, val_rows=400, statuses=None):
    """Tune records: values_by_seed[seed][i] is the validation accuracy at GRID[i]."""
    records = []
    for seed, values in values_by_seed.items():
        for lr, value in zip(GRID, values, strict=True):
            status = (statuses or {}).get((seed, lr), "ok")
            records.append(Record(trial_id=f"{seed}-{lr}", optimizer="adamw", seed=seed, lr=lr, stage="tune",
                                  status=status, val_metric=value if status == "ok" else None, val_rows=val_rows))
    return records


def test_an_untied_grid_takes_the_best_even_at_the_edge():
    choice = stats.choice_from_records("adamw", GRID, _tune({0: [0.70, 0.80, 0.85, 0.90, 0.50]}), 100)
    assert choice.lr == 1e-2 and choice.note == "best mean validation metric"
    assert choice.band == pytest.approx(math.sqrt(2 * 0.9 * 0.1 / 400))  # √2 x binomial SE at p = 0.90
    assert choice.band_basis == "binomial error of 400 validation rows" and choice.tune_seeds == 1


def test_a_near_tie_within_the_binomial_band_goes_to_the_middle_of_the_grid():
    values = [0.70, 0.875, 0.86, 0.88, 0.50]  # band √(2 x .88 x .12 / 400) = 2.30 pts: .875 and .86 tie with .88
    choice = stats.choice_from_records("adamw", GRID, _tune({0: values}), 100)
    assert choice.lr == 1e-3 and choice.note.startswith("3 lrs within the near-tie band")
    finer = stats.choice_from_records("adamw", GRID, _tune({0: values}, val_rows=4000), 100)
    assert finer.lr == 1e-4  # band 0.73 pts: .875 and .88 tie, equally far from 1e-3: the smaller lr


def test_a_perfect_validation_score_leaves_the_band_one_row_wide_not_zero():
    """A user's 30 validation rows, two lrs at 1.0 and one a row short: the binomial error at p = 1 is 0, so the
    band was 0 and a row short lost; the band is now that of p one row from 1."""
    choice = stats.choice_from_records("adamw", GRID, _tune({0: [0.5, 29 / 30, 1.0, 1.0, 0.5]}, val_rows=30), 100)
    near = 29 / 30
    assert choice.band == pytest.approx(math.sqrt(2 * near * (1 - near) / 30))
    assert choice.note.startswith("3 lrs within the near-tie band") and choice.lr == 1e-3


def test_two_tune_seeds_average_and_their_spread_widens_the_band():
    seeds = {0: [0.70, 0.86, 0.82, 0.92, 0.50], 1: [0.72, 0.84, 0.90, 0.86, 0.50]}
    one = stats.choice_from_records("adamw", GRID, _tune({0: seeds[0]}, val_rows=None), 100)
    assert one.lr == 1e-2 and one.band == stats.LEGACY_TIE  # no val_rows, one seed: the old half point
    two = stats.choice_from_records("adamw", GRID, _tune(seeds, val_rows=None), 100)
    # means .71 .85 .86 .89 .50; pooled variance (.0002 + .0002 + .0032 + .0018 + 0) / 5 = .00108
    assert [p.value for p in two.points] == pytest.approx([0.71, 0.85, 0.86, 0.89, 0.50])
    assert two.band == pytest.approx(math.sqrt(2 * 0.00108 / 2)) and two.tune_seeds == 2
    assert two.lr == 1e-3  # .86 is within 3.3 pts of .89
    both = stats.choice_from_records("adamw", GRID, _tune(seeds), 100)
    assert both.band == pytest.approx(math.sqrt(2 * (0.89 * 0.11 / 400 + 0.00108) / 2))
    assert both.band_basis == "binomial error of 400 validation rows + seed SD over 2 tune seeds"


def test_a_point_that_failed_on_any_seed_never_wins_and_order_does_not_matter():
    seeds = {0: [0.70, 0.80, 0.85, 0.99, 0.50], 1: [0.70, 0.80, 0.85, 0.99, 0.50]}
    records = _tune(seeds, statuses={(1, 1e-2): "diverged"})
    choice = stats.choice_from_records("adamw", GRID, records, 100)
    assert choice.points[3].status == "diverged" and choice.points[3].value is None
    assert choice.lr == 1e-3
    again = stats.choice_from_records("adamw", GRID, list(reversed(records)) + records[:3], 100)  # resumed, re-run
    assert (again.lr, again.band) == (choice.lr, choice.band)
    assert stats.choice_from_records("adamw", GRID, [], 100).lr is None


def test_a_min_metric_with_one_seed_uses_half_a_percent_of_the_best():
    records = [Record(trial_id=str(lr), optimizer="adamw", lr=lr, stage="tune", status="ok", val_metric=ppl,
                      target_metric="perplexity", target_mode="min")
               for lr, ppl in zip(GRID, [30.0, 20.05, 20.2, 20.0, 50.0], strict=True)]
    choice = stats.choice_from_records("adamw", GRID, records, 100)
    assert choice.band == pytest.approx(0.1) and choice.lr == 1e-4  # 20.05 within 0.1 of 20.0; 20.2 is not


def test_tunability_counts_failed_points_in_the_grid():
    assert stats.tunability([0.80, 0.805, 0.70, None], "max") == pytest.approx(0.5)
    assert stats.tunability([30.0, 30.2, 35.0], "min") == pytest.approx(2 / 3)  # 1 % of 30 = 0.3
    assert stats.tunability([None, None], "max") is None
