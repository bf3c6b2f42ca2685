"""The same tiny trial through each engine: identical optimizer state, every record field filled."""

import pytest

from optbench import optimizers
from optbench.engines import ENGINES, get_engine
from optbench.plan import TrialSpec
from optbench.trial import run_trial

TINY = dict(workload="tiny", device="cpu", steps=6, warmup_steps=2, batch_size=4, seq_len=16, eval_size=24)
OPTIMIZERS = [name for name in ("adamw", "adafactor") if optimizers.resolve(name).available]


@pytest.fixture(scope="module")
def records():
    return {(engine, name): run_trial(TrialSpec(optimizer=name, engine=engine, **TINY))
            for engine in ENGINES for name in OPTIMIZERS}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_engines_hold_the_same_state(records, name):
    by_engine = {engine: records[engine, name] for engine in ENGINES}
    for engine, record in by_engine.items():
        assert record.status == "ok", (engine, record.error)
        assert record.engine == engine
    native = by_engine["native"]
    assert native.state_bytes == native.analytic_state_bytes
    for engine, record in by_engine.items():
        assert record.state_bytes == native.state_bytes, engine
        assert record.state_bytes_by_key == native.state_bytes_by_key, engine


@pytest.mark.parametrize("engine", ENGINES)
def test_engine_fills_the_timing_and_quality_fields(records, engine):
    record = records[engine, OPTIMIZERS[0]]
    assert len(record.loss_curve) == TINY["steps"] and record.train_loss_final > 0
    assert record.first_step_s > 0
    timed_steps = TINY["steps"] - TINY["warmup_steps"]
    assert len(record.step_time_samples_s) == len(record.optimizer_step_samples_s) == timed_steps
    assert record.step_time_median_s > record.optimizer_step_median_s > 0
    assert record.peak_rss_bytes > 0 and record.peak_rss_growth_bytes is not None
    assert 0 <= record.eval_accuracy <= 1


@pytest.mark.parametrize("engine", ["trainer", "accelerate"])
def test_engine_records_an_eval_curve(engine):
    record = run_trial(TrialSpec(optimizer="adamw", engine=engine, eval_every=3, **TINY))
    assert record.status == "ok", record.error
    assert [point[0] for point in record.eval_curve] == [3, 6]
    assert record.eval_curve[0][1] < record.eval_curve[1][1]


@pytest.mark.parametrize("engine", ["trainer", "accelerate"])
def test_engine_records_divergence(engine):
    record = run_trial(TrialSpec(optimizer="adamw", engine=engine, lr=1e4, **TINY))
    assert record.status == "diverged", record.error


def test_unknown_engine_lists_the_known_ones():
    with pytest.raises(ValueError, match="native, trainer, accelerate"):
        get_engine("keras")


def test_accelerate_trains_on_the_native_batches_step_for_step(records):
    """Same batches, same order, same dropout draws: on one CPU process the Accelerate loop computes exactly
    what the native loop does, so an engine comparison measures the loop, not a data order."""
    native, accelerate = records["native", "adamw"], records["accelerate", "adamw"]
    assert accelerate.loss_curve == native.loss_curve
    assert accelerate.eval_accuracy == native.eval_accuracy
