"""The predictor's margin on fresh trials (optbench/memory/coverage.py), on constructed records: every figure from
the records' own predictions, trials used for calibration or the margin never counted as fresh."""

import pytest

from optbench.job.spec import TrialSpec
from optbench.memory import coverage
from optbench.records.record import MIB, Record
from optbench.workloads import get_workload

WEIGHTS = 100 * MIB


def _trial(trial_id, measured_mib, predicted_mib, batch=16, seq=32, workload="minilm"):
    model = get_workload(workload).model_name(TrialSpec(optimizer="adamw", workload=workload))  # the default model
    return Record(trial_id=trial_id, optimizer="adamw", status="ok", device="cpu", workload=workload, model=model,
                  batch_size=batch, seq_len=seq, weights_bytes=WEIGHTS,
                  peak_rss_growth_bytes=int(measured_mib * MIB) - WEIGHTS,
                  predicted_peak_bytes=int(predicted_mib * MIB))


CALIBRATION = [_trial("c1", 500, 500, batch=8), _trial("c2", 900, 900, batch=128, seq=256)]
HELD_OUT = [_trial("h1", 530, 500), _trial("h2", 480, 500), _trial("h3", 1000, 1050)]  # worst under: +6 %


def test_the_band_comes_from_the_records_own_predictions():
    band = coverage.own_band(HELD_OUT)
    assert band.trials == 3 and band.worst_under == pytest.approx(0.06, abs=1e-6)
    assert band.share_under == pytest.approx(1 / 3) and band.safety_margin == pytest.approx(0.06, abs=1e-6)
    assert band.worst_under_bytes == 30 * MIB  # h1: 530 measured against 500 predicted
    with pytest.raises(ValueError, match="no cpu record"):
        coverage.own_band([Record(trial_id="x", status="ok", device="cpu")])  # no prediction of its own


def test_coverage_counts_fresh_trials_under_prediction_plus_margin_and_names_shapes_outside_the_range():
    fresh = [_trial("f1", 520, 500), _trial("f2", 540, 500, batch=160), _trial("f3", 490, 500, batch=2),
             _trial("f4", 500, 500, seq=16), *HELD_OUT[:1]]  # a held-out trial is never fresh
    found = coverage.coverage(fresh, coverage.own_band(HELD_OUT), CALIBRATION, HELD_OUT)
    assert (found.covered, found.trials, found.outside_range) == (3, 4, 3)
    assert found.share == 0.75 and "NOT met" in found.describe() and "3 of them outside" in found.describe()
    rows = list(found.table[["batch", "seq", "covered", "outside calibration range"]].itertuples(index=False))
    assert [tuple(r) for r in rows] == [(16, 32, True, ""), (160, 32, False, "batch above"),
                                        (2, 32, True, "batch below"), (16, 16, True, "seq below")]


def test_a_small_trial_is_held_to_the_margin_in_bytes_when_that_is_larger_than_the_share():
    """+25 % over a 110 MiB prediction is 27.5 MiB: past the 6 % share (6.6 MiB), inside the 30 MiB the held-out
    trials were under-predicted by; +35 % (38.5 MiB) is past both."""
    band = coverage.own_band(HELD_OUT)
    fresh = [_trial("s1", 137.5, 110, batch=2), _trial("s2", 148.5, 110, batch=2)]
    found = coverage.coverage(fresh, band, CALIBRATION, HELD_OUT)
    assert list(found.table["covered"]) == [True, False]
    assert list(found.table["margin MiB"]) == [30.0, 30.0]
    assert "+6.0 % or 30 MiB, whichever is larger" in found.describe()
    assert found.covered_by_share == 0 and "the share alone, +6.0 %, covers 0/2" in found.describe()
    assert band.margin_bytes(1000 * MIB) == pytest.approx(60 * MIB, abs=1)  # the share, where it is larger


def test_the_report_takes_its_margin_from_the_held_out_trials(capsys, tmp_path):
    from optbench.records.record import append_record

    paths = {}
    for name, records in (("cal", CALIBRATION), ("held", HELD_OUT),
                          ("fresh", [_trial(f"f{i}", 500 + i, 500) for i in range(20)])):
        paths[name] = tmp_path / f"{name}.jsonl"
        for record in records:
            append_record(paths[name], record)
    code = coverage.main(["--calibration", str(paths["cal"]), "--held-out", str(paths["held"]),
                          "--fresh", str(paths["fresh"])])
    out = capsys.readouterr().out
    assert code == 0 and "coverage 20/20 = 100.0 %" in out and "required: met;" in out
    assert "safety margin +6.0 % or 30 MiB" in out
