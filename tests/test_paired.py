"""--paired-probe: the stream kernel timed after every optimizer step, each step read against that pass."""

import statistics

import pytest
import torch

from optbench.job import planner
from optbench.job.spec import PRESETS, TrialSpec
from optbench.probes.paired import PairedStream
from optbench.probes.timing import StepSamples
from optbench.trial.run import run_trial

TINY = dict(workload="tiny", device="cpu", steps=6, warmup_steps=1, batch_size=4, seq_len=16, eval_size=16)


def test_each_timed_step_is_paired_with_the_pass_after_it():
    """Steps 0 (the first that stepped) and 1 (warm-up) are not timed; step 3 was skipped (no pass after it): the
    share is the median over steps 2, 4 and 5 of traffic / step time / that step's pass."""
    samples = StepSamples(warmup_steps=2)
    for step, optimizer_s, stepped in ((0, 9.0, True), (1, 9.0, True), (2, 0.010, True), (3, 0.5, False),
                                       (4, 0.020, True), (5, 0.040, True)):
        samples.add(step, 1.0, optimizer_s, stepped)
    probe = PairedStream(torch.device("cpu"), 1024)
    probe.bytes_per_s = {0: 1.0, 1: 1.0, 2: 100.0, 4: 50.0, 5: 100.0}
    passes, share = probe.paired(samples, traffic_bytes=1)
    assert samples.timed_steps == [2, 4, 5] and passes == [100.0, 50.0, 100.0]
    assert share == pytest.approx(statistics.median([1 / 0.010 / 100, 1 / 0.020 / 50, 1 / 0.040 / 100]))
    assert probe.paired(samples, traffic_bytes=None)[1] is None


def test_a_pass_moves_seven_times_its_operand_and_keeps_the_values_finite():
    probe = PairedStream(torch.device("cpu"), 4 * 2**20)
    for step in range(3):
        probe.after_step(step)
    assert probe.kernel.moved_bytes == 7 * 4 * 2**20 and sorted(probe.bytes_per_s) == [0, 1, 2]
    assert all(b > 0 for b in probe.bytes_per_s.values()) and torch.isfinite(probe.kernel.weights).all()


def test_a_trial_with_the_probe_records_a_pass_per_timed_step_and_a_share():
    record = run_trial(TrialSpec(optimizer="adamw_fused", paired_probe=True, **TINY))
    assert record.status == "ok", record.error
    timed = TINY["steps"] - TINY["warmup_steps"]
    assert len(record.paired_probe_bytes_per_s) == len(record.optimizer_step_samples_s) == timed
    assert record.paired_roofline_fraction is not None and record.paired_roofline_fraction > 0
    plain = TrialSpec(optimizer="adamw_fused", **TINY)
    assert plain.trial_id != TrialSpec(optimizer="adamw_fused", paired_probe=True, **TINY).trial_id


def test_a_trial_without_the_probe_records_none():
    record = run_trial(TrialSpec(optimizer="adamw", **TINY))
    assert record.status == "ok" and record.paired_probe_bytes_per_s == [] and record.paired_roofline_fraction is None


@pytest.mark.parametrize("flags", [{"engine": "trainer"}, {"parallel": "ddp"}])
def test_the_probe_runs_in_the_native_loop_of_one_process_only(flags):
    with pytest.raises(planner.PlanError, match="--paired-probe times its pass in the native loop of one process"):
        planner.job_settings({"paired_probe": True, **flags}, PRESETS["smoke"])


def test_the_report_shows_the_paired_share_in_percent():
    from optbench.records.record import Record
    from optbench.report import metrics

    assert metrics.record_values(Record(paired_roofline_fraction=0.9))["paired_roofline_pct"] == pytest.approx(90)
    assert metrics.record_values(Record())["paired_roofline_pct"] is None
