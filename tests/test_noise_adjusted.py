"""The optimizer step's change adjusted for each process's own speed (report/noise.py, `adjusted`): the covariance
analysis on the rest of the step, its guard (the rest of the step moved too), and how compare, its table and the gate
campaign show it. Hand-made records: no torch."""

import dataclasses

import numpy as np
import pytest
from scipy import stats as scipy_stats

from optbench.records.record import Record
from optbench.report import campaign, compare, compare_table, metrics, noise

JOB = dict(model="m", dataset="d", device="cpu", steps=10, batch_size=4, seq_len=8, workload="w")
LIMITS = compare.Thresholds(max_slowdown_pct=10.0)


def _process(seed: int, speed: float, slowdown: float = 1.0, rest_moved: float = 1.0, noise_sd: float = 0.01,
             steps: int = 20) -> Record:
    """One process: its rest of the step at 0.3 s x `speed` (x `rest_moved`), its optimizer step at 0.1 s x
    speed**1.5 x `slowdown`, each step with a small independent log-normal noise."""
    rng = np.random.default_rng(seed)
    rest = 0.3 * speed * rest_moved * np.exp(noise_sd * rng.standard_normal(steps))
    own = 0.1 * speed**1.5 * slowdown * np.exp(noise_sd * rng.standard_normal(steps))
    return Record(trial_id=f"t-{seed}", optimizer="adafactor", status="ok", seed=seed, state_bytes=1,
                  step_time_samples_s=list(rest + own), optimizer_step_samples_s=list(own),
                  step_time_median_s=float(np.median(rest + own)), optimizer_step_median_s=float(np.median(own)),
                  eval_accuracy=0.9, **JOB)


def _side(first_seed: int, n: int = 6, **changes) -> list[Record]:
    """n processes whose speeds spread by 8 % (what a whole process shifts by on the 2-core CPU)."""
    speeds = np.exp(0.08 * np.random.default_rng(first_seed).standard_normal(n))
    return [_process(first_seed + i, float(speed), **changes) for i, speed in enumerate(speeds)]


def _row(base: list[Record], new: list[Record]):
    (row,) = compare.compare(base, new, LIMITS).rows.itertuples()
    return row


def test_the_rest_of_the_step_is_the_median_of_the_steps_without_their_optimizer_step():
    record = _process(0, 1.0)
    rest = [total - own for total, own in zip(record.step_time_samples_s, record.optimizer_step_samples_s,
                                              strict=True)]
    assert metrics.BY_COLUMN["rest_of_step_ms"].value(record) == pytest.approx(1e3 * float(np.median(rest)))
    bare = dataclasses.replace(record, step_time_samples_s=[], optimizer_step_samples_s=[])
    assert metrics.BY_COLUMN["rest_of_step_ms"].value(bare) == pytest.approx(
        1e3 * (record.step_time_median_s - record.optimizer_step_median_s))


def test_the_adjusted_change_is_the_side_coefficient_of_the_covariance_analysis():
    base = [(1.00, 3.0), (1.10, 3.2), (0.93, 2.9), (1.05, 3.1)]
    new = [(1.31, 3.0), (1.40, 3.15), (1.22, 2.85), (1.36, 3.05)]
    found = noise.adjusted(base, new, "rest_of_step_ms", noise.change([y for y, _ in base], [y for y, _ in new]))
    logs = np.log([*base, *new])
    design = np.column_stack([np.ones(8), [0] * 4 + [1] * 4, logs[:, 1]])
    coefficients, *_ = np.linalg.lstsq(design, logs[:, 0], rcond=None)
    residuals = logs[:, 0] - design @ coefficients
    se = np.sqrt(residuals @ residuals / 5 * np.linalg.inv(design.T @ design)[1, 1])
    half = scipy_stats.t.ppf(0.975, 5) * se
    assert found.basis == noise.ADJUSTED and found.adjustment.applied
    assert found.ratio == pytest.approx(np.exp(coefficients[1]))
    assert (found.low, found.high) == pytest.approx((np.exp(coefficients[1] - half), np.exp(coefficients[1] + half)))
    assert found.adjustment.slope == pytest.approx(coefficients[2])


def test_a_slowdown_is_measured_through_the_processes_own_speeds():
    """Processes 8 % apart in speed: the unadjusted interval is as wide as they spread; the adjusted one is narrow
    and holds the injected +30 %."""
    row = _row(_side(0), _side(100, slowdown=1.3))
    low, high = row.opt_step_ms_low, row.opt_step_ms_high
    assert row.opt_step_ms_test == noise.ADJUSTED and low < 30 < high and high - low < 4
    before = row.opt_step_ms_unadjusted
    assert before[2] - before[1] > 2 * (high - low)
    assert "adjusted for the rest of the step (slope 1.5" in row.opt_step_ms_adjustment
    assert row.step_ms_test == "between-run"  # the whole step holds the covariate: never adjusted


def test_same_commit_runs_read_no_change():
    row = _row(_side(0), _side(200))
    assert row.opt_step_ms_test == noise.ADJUSTED and row.opt_step_ms_low < 0 < row.opt_step_ms_high


def test_when_the_rest_of_the_step_moved_too_the_change_stands_unadjusted():
    """A change that slows the whole step (a new torch, a new model) would be read away by the adjustment: the
    unadjusted change stands, and the cell says why."""
    base, new = _side(0), _side(300, slowdown=1.2, rest_moved=1.2)
    row = _row(base, new)
    assert row.opt_step_ms_test == "between-run" and row.opt_step_ms_unadjusted is None
    assert row.opt_step_ms_adjustment.startswith("not adjusted: the rest of the step moved too (+")
    assert row.opt_step_ms_delta > 10  # the +20 % itself, not read away to about -10 %
    assert "not adjusted: the rest of the step moved too" in compare_table.render_markdown(
        compare.compare(base, new, LIMITS))


def test_fewer_than_three_processes_a_side_are_never_adjusted():
    row = _row(_side(0, n=2), _side(100, n=2, slowdown=1.3))
    assert row.opt_step_ms_adjustment is None and row.opt_step_ms_test == "threshold"


def test_the_campaign_cell_gives_the_adjusted_and_the_unadjusted_figures():
    outcome = campaign.Outcome(30.0, flagged=2, compared=2, changes=[29.0, 31.0], adjusted=2, unadjusted_flagged=1,
                               unadjusted_changes=[22.0, 36.0])
    assert outcome.within_tolerance() == 2 and outcome.within_tolerance(unadjusted=True) == 0
    cell = outcome.cell()
    assert cell.startswith("flagged 2/2; measured +30.0 % (+29.0 … +31.0); within ±5 pts of +30 %: 2/2 (adjusted: 2/2)")
    assert cell.endswith("unadjusted: flagged 1/2; measured +29.0 % (+22.0 … +36.0); within ±5 pts of +30 %: 0/2")
    plain = campaign.Outcome(0.0, compared=1, changes=[1.0], unadjusted_changes=[1.0])
    assert "unadjusted" not in plain.cell()
