"""What a quality figure's bounds say: untrained near chance, saturated at the ceiling or on flat curves (with
why), and no number from a job that did not train in any table, smoke tables included."""

import pytest

from optbench.records.record import Record
from optbench.report import bounds, stats
from optbench.report.frame import summarize, trials_frame
from optbench.report.render import display_tables, render_terminal

ROWS = 1000


def _record(optimizer: str, seed: int, value: float, *, ceiling=0.97, chance=0.34, curve=None,
            steps=150, rows=ROWS) -> Record:
    return Record(trial_id=f"{optimizer}-{seed}", status="ok", optimizer=optimizer, seed=seed, workload="w",
                  model="m", dataset="d", device="cpu", steps=steps, batch_size=16, seq_len=32, eval_size=rows,
                  lr=1e-4, eval_metrics={"accuracy": value}, eval_accuracy=value, eval_rows=rows,
                  metric_ceiling=ceiling, metric_chance=chance, state_bytes=1, state_bytes_per_param=1.0,
                  step_time_median_s=0.4, eval_curve=curve or [])


def _verdict(records):
    summary = summarize(trials_frame(records))
    return summary.set_index("optimizer").loc["adamw8bit"]


def _curve(final: float, gain: float) -> list[list[float]]:
    """An eval curve at 50, 100, 150 steps gaining `gain` over its last third."""
    return [[50, 20.0, final - 3 * gain], [100, 40.0, final - gain], [150, 60.0, final]]


def test_a_pair_at_the_ceiling_is_saturated_not_equivalent():
    # Noise at the ceiling 0.97 over 1,000 rows: 1.96 x sqrt(0.97 x 0.03 / 1000) = 1.06 points.
    records = [_record(name, seed, 0.965 + 0.001 * seed + (0.002 if name == "adamw8bit" else 0.0),
                       curve=_curve(0.96, 0.02))
               for name in ("adamw", "adamw8bit") for seed in range(4)]
    row = _verdict(records)
    assert row["verdict_word_vs_adamw"] == stats.SATURATED
    assert "within the eval split's noise (±1.1 pts over 1000 rows) of the ceiling 0.97" in row["verdict_vs_adamw"]
    assert row["detectable_vs_adamw"] == pytest.approx(1.0)  # no spread in the differences: the margin itself


def test_the_same_pair_below_the_ceiling_is_equivalent_with_its_detectable_difference():
    records = [_record(name, seed, 0.85 + 0.004 * seed + (0.003 * (seed % 2) if name == "adamw8bit" else 0.0),
                       curve=_curve(0.85, 0.02))
               for name in ("adamw", "adamw8bit") for seed in range(4)]
    row = _verdict(records)
    assert row["verdict_word_vs_adamw"] == stats.EQUIVALENT
    # differences 0, +0.3, 0, +0.3 points: s = 0.173, so the MDD is 1 + 4.161 x 0.173 / 2 = 1.36 points
    assert row["detectable_vs_adamw"] == pytest.approx(stats.minimum_detectable_difference(0.17321, 4, 1.0), abs=1e-3)
    table = display_tables(summarize(trials_frame(records)))[0][1].set_index("optimizer")
    assert table.loc["adamw", "ceiling"] == "0.9700"  # printed beside the metric
    assert table.loc["adamw8bit", "min. detectable Δ"].endswith(" pts")


def test_every_seed_at_one_with_no_ceiling_known_is_saturated_at_the_metrics_maximum():
    """A user's 30 held-out rows, both arms at accuracy 1.0 on two seeds: "equivalent within ±1 pt; min. detectable
    Δ 1.00 pts" at a paired spread of 0, where one row is worth 3.3 points."""
    records = [_record(name, seed, 1.0, ceiling=None, rows=30) for name in ("adamw", "adamw8bit") for seed in (0, 1)]
    row = _verdict(records)
    assert row["verdict_word_vs_adamw"] == stats.SATURATED
    assert "every arm scored 1 on every seed, the metric's maximum" in row["verdict_vs_adamw"]
    assert row["detectable_vs_adamw"] == pytest.approx(100 / 30)  # not finer than one eval row


def test_a_split_whose_one_row_outweighs_the_margin_calls_no_sameness():
    records = [_record(name, seed, 0.9, ceiling=None, rows=30) for name in ("adamw", "adamw8bit") for seed in (0, 1)]
    row = _verdict(records)
    assert row["verdict_word_vs_adamw"] == stats.INCONCLUSIVE
    assert "one eval row is 3.3 pts, more than the ±1 pts margin" in row["verdict_vs_adamw"]
    many = _verdict([_record(name, seed, 0.9, ceiling=None, rows=4000)
                     for name in ("adamw", "adamw8bit") for seed in (0, 1)])
    assert many["verdict_word_vs_adamw"] == stats.EQUIVALENT  # a row of 0.025 pts: the verdict stands
    assert many["detectable_vs_adamw"] == pytest.approx(1.0)


def test_curves_that_stopped_moving_are_saturated():
    records = [_record(name, seed, 0.80 + 0.001 * seed, curve=_curve(0.80 + 0.001 * seed, 0.002))
               for name in ("adamw", "adamw8bit") for seed in range(3)]
    row = _verdict(records)
    assert row["verdict_word_vs_adamw"] == stats.SATURATED
    assert "moved under 0.5 pts over the last third of training" in row["verdict_vs_adamw"]


def test_one_seed_still_moving_keeps_the_verdict():
    records = [_record(name, seed, 0.80, curve=_curve(0.80, 0.02 if (name, seed) == ("adamw", 2) else 0.002))
               for name in ("adamw", "adamw8bit") for seed in range(3)]
    assert _verdict(records)["verdict_word_vs_adamw"] == stats.EQUIVALENT


def test_a_real_difference_at_the_ceiling_stays_a_finding():
    records = [_record("adamw", seed, 0.97, curve=_curve(0.97, 0.0)) for seed in range(3)]
    records += [_record("adamw8bit", seed, 0.90 + 0.001 * seed, curve=_curve(0.9, 0.0)) for seed in range(3)]
    assert _verdict(records)["verdict_word_vs_adamw"] == stats.WORSE


def test_perplexity_near_the_floor_is_saturated_and_at_the_unigram_is_untrained():
    def lm(optimizer, seed, value):
        record = _record(optimizer, seed, value, ceiling=4.4, chance=160.0)
        record.target_metric, record.target_mode = "perplexity", "min"
        record.eval_metrics = {"perplexity": value}
        return record

    at_floor = [lm(name, seed, 4.45 + 0.01 * seed) for name in ("adamw", "adamw8bit") for seed in range(3)]
    assert _verdict(at_floor)["verdict_word_vs_adamw"] == stats.SATURATED
    assert bounds.untrained(165.0, 160.0, "min") and not bounds.untrained(40.0, 160.0, "min")


def test_untrained_is_within_two_points_of_chance():
    assert bounds.untrained(0.355, 0.34, "max") and bounds.untrained(0.30, 0.34, "max")
    assert not bounds.untrained(0.37, 0.34, "max") and not bounds.untrained(0.35, None, "max")


def test_a_smoke_table_says_untrained_instead_of_a_number():
    records = [_record("adamw", 0, 0.345, curve=[]), _record("adamw8bit", 0, 0.352, curve=[]),
               _record("adafactor", 0, 0.60, curve=[])]
    summary = summarize(trials_frame(records))
    table = display_tables(summary)[0][1].set_index("optimizer")
    assert table.loc["adamw", "eval accuracy"] == "untrained"
    assert table.loc["adamw8bit", "eval accuracy"] == "untrained"
    assert table.loc["adafactor", "eval accuracy"] == "0.6000 ± n/a"
    assert table.loc["adamw8bit", "accuracy Δ vs adamw (95% CI)"] == "untrained"  # no figure from a job at chance
    assert table.loc["adafactor", "accuracy Δ vs adamw (95% CI)"] == "untrained"  # the reference did not train
    terminal = render_terminal(summary)
    assert "0.345" not in terminal and "0.352" not in terminal and "untrained" in terminal
    # nor in summary.csv or --format json: the untrained rows carry their counts, not a figure
    csv = summary.to_csv(index=False)
    assert "0.345" not in csv and "0.352" not in csv and "0.6" in csv
    rows = summary.set_index("optimizer")
    assert rows.loc["adamw", "eval_target_n"] == 1 and rows.loc["adamw", "untrained"] == 1


def test_an_untrained_candidate_against_a_reference_that_learned_is_worse_without_a_figure():
    """The positive control's shape: SGD left at chance, AdamW at 0.87, six seeds. No number for the arm at chance,
    but the verdict stands: it is worse. A reference at chance makes every comparison say `untrained` alone."""
    records = [_record(name, seed, value + 0.002 * seed, curve=[]) for seed in range(6)
               for name, value in (("adamw", 0.87), ("sgd_momentum", 0.345))]
    table = display_tables(summarize(trials_frame(records)))[0][1].set_index("optimizer")
    assert table.loc["sgd_momentum", "eval accuracy"] == "untrained"
    assert table.loc["sgd_momentum", "accuracy Δ vs adamw (95% CI)"] == "untrained: worse by at least 1 pt"
    flipped = [_record(name, seed, value + 0.002 * seed, curve=[]) for seed in range(6)
               for name, value in (("adamw", 0.345), ("sgd_momentum", 0.87))]
    table = display_tables(summarize(trials_frame(flipped)))[0][1].set_index("optimizer")
    assert table.loc["sgd_momentum", "accuracy Δ vs adamw (95% CI)"] == "untrained"


def test_some_untrained_seeds_are_counted_beside_the_mean():
    records = [_record("adamw", seed, value) for seed, value in enumerate((0.35, 0.70, 0.72))]
    table = display_tables(summarize(trials_frame(records)))[0][1]
    assert table["eval accuracy"].iloc[0].endswith("(untrained 1/3)")


def test_the_per_rank_table_says_untrained_at_chance():
    from optbench.trial.engines.parallel import per_rank_markdown

    record = _record("adamw", 0, 0.345)
    record.parallel, record.world_size = "ddp", 2
    record.per_rank = [{"rank": r, "status": "ok", "eval_accuracy": 0.345, "weights_bytes": 1, "grads_bytes": 1,
                        "state_bytes": 1} for r in (0, 1)]
    text = per_rank_markdown([record])
    assert "untrained" in text and "0.345" not in text
