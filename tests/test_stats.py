"""Statistics pinned on hand-computed numbers (t quantiles from a printed table)."""

import math

import pytest

from optbench import stats


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
    assert interval.half_width is None and interval.n == 1
    assert "n/a" in interval.text()
    assert stats.mean_ci([None, float("nan")]) is None


def test_paired_difference_better_worse_and_noise():
    ref = {0: 0.80, 1: 0.82, 2: 0.84}
    better = stats.paired_difference({0: 0.85, 1: 0.86, 2: 0.90}, ref, "max")
    # differences 0.05, 0.04, 0.06: mean 0.05, s 0.01 -> half-width 4.3027 * 0.01 / sqrt(3) = 0.0248
    assert better.difference.mean == pytest.approx(0.05)
    assert better.difference.half_width == pytest.approx(0.024842, abs=1e-5)
    assert better.verdict == stats.BETTER
    assert stats.paired_difference({0: 0.75, 1: 0.77, 2: 0.80}, ref, "max").verdict == stats.WORSE
    noisy = stats.paired_difference({0: 0.85, 1: 0.78, 2: 0.84}, ref, "max")
    assert noisy.verdict == stats.SAME


def test_paired_difference_respects_min_mode_and_shared_seeds():
    ref = {0: 20.0, 1: 21.0, 2: 22.0, 3: 99.0}
    lower = stats.paired_difference({0: 18.0, 1: 19.1, 2: 19.9}, ref, "min")
    assert lower.difference.n == 3  # seed 3 has no partner
    assert lower.verdict == stats.BETTER  # lower perplexity is better
    assert stats.paired_difference({0: 1.0}, {0: 0.5}, "max").verdict.startswith("n/a")
    assert stats.paired_difference({5: 1.0}, {0: 0.5}, "max") is None
    same_step = stats.paired_difference({0: 0.50, 1: 0.75}, {0: 0.25, 1: 0.50}, "max")
    assert same_step.verdict.startswith("n/a") and same_step.difference.half_width == 0


def test_tunability_counts_failed_points_in_the_grid():
    assert stats.tunability([0.80, 0.805, 0.70, None], "max") == pytest.approx(0.5)
    assert stats.tunability([30.0, 30.2, 35.0], "min") == pytest.approx(2 / 3)  # 1 % of 30 = 0.3
    assert stats.tunability([None, None], "max") is None


def test_performance_profile_and_score():
    times = {"job a": {"adamw": 10.0, "adafactor": 20.0, "adamw8bit": None},
             "job b": {"adamw": 30.0, "adafactor": 15.0, "adamw8bit": 45.0}}
    taus = [1.0, 2.0, 3.0, 4.0]
    profile = stats.performance_profile(times, taus)
    assert profile["adamw"] == [0.5, 1.0, 1.0, 1.0]
    assert profile["adafactor"] == [0.5, 1.0, 1.0, 1.0]
    assert profile["adamw8bit"] == [0.0, 0.0, 0.5, 0.5]
    assert stats.profile_score(profile["adamw"], taus) == pytest.approx((0.75 + 1 + 1) / 3)
    assert stats.profile_score([1.0] * 4, taus) == pytest.approx(1.0)
