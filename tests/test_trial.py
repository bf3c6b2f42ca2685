"""One trial in this process on the tiny BERT: every record field filled, failures become statuses. Figures are
checked against values computed here another way (numpy's quantiles, the byte count a step must move), not
against the production formula restated."""

import statistics

import numpy as np
import pytest

from optbench import optimizers
from optbench.job.spec import TrialSpec
from optbench.probes import measure, stream
from optbench.trial.run import run_trial

TINY = dict(workload="tiny", device="cpu", steps=6, warmup_steps=2, batch_size=4, seq_len=16, eval_size=24)


# One entry per kind of trial path: plain, factored, 8-bit (bitsandbytes), model-aware param groups (muon),
# eval hooks (schedule-free). Every available entry's exact state is checked in test_optimizers.py.
TRIAL_PATHS = ["adamw", "adafactor", "adamw8bit", "muon", "adamw_schedulefree"]


@pytest.mark.parametrize("name", [n for n in TRIAL_PATHS if optimizers.resolve(n).available])
def test_trial_fills_the_record(name):
    record = run_trial(TrialSpec(optimizer=name, **TINY))
    assert record.status == "ok", record.error
    assert record.state_bytes == record.analytic_state_bytes > 0
    assert record.num_params > 1_000_000 and record.weights_bytes == record.grads_bytes == 4 * record.num_params
    assert record.device == "cpu" and record.device_name
    assert record.peak_cuda_allocated_bytes is None
    # In this long-lived test process freed memory is reused, so growth may read 0 here; the fresh
    # process of a real trial is checked in test_cli.
    assert record.peak_rss_bytes > record.peak_rss_growth_bytes >= 0
    assert len(record.loss_curve) == 6 and record.train_loss_final == pytest.approx(
        statistics.fmean(record.loss_curve[-5:]))  # the last five steps' losses
    assert record.first_step_s > 0 and record.step_time_median_s > record.optimizer_step_median_s > 0
    assert len(record.step_time_samples_s) == 4  # steps 2 to 5: the steps after the 2 warm-up steps
    q1, median, q3 = np.percentile(record.step_time_samples_s, [25, 50, 75])
    assert (record.step_time_median_s, record.step_time_iqr_s) == pytest.approx((median, q3 - q1))
    assert record.samples_per_s * record.step_time_median_s == pytest.approx(TINY["batch_size"])
    assert round(record.eval_accuracy * 24) == pytest.approx(record.eval_accuracy * 24)  # scored on 24 rows
    assert record.eval_accuracy == record.eval_metrics["accuracy"] and record.eval_f1 == record.eval_metrics["f1"]
    assert record.env["torch"] and record.env["transformers"] and "git_commit" in record.env
    assert record.lr == optimizers.resolve(name).default_lr
    # where the state sits, and what the held memory holds besides grads and state: the three parts add up
    assert sum(record.state_bytes_by_module.values()) == record.state_bytes
    assert record.held_other_bytes + record.grads_bytes + record.state_bytes == record.rss_growth_after_step_bytes
    # the trial's own bandwidth probe is a check; without a machine calibration there is no roofline (its
    # arithmetic against a calibration: test_speed_figures_from_known_times, test_bandwidth.py)
    assert record.device_bandwidth_bytes_per_s > 0 and record.device_bandwidth_iqr_bytes_per_s is not None
    assert record.roofline_fraction is None and record.device_bandwidth_calibrated_bytes_per_s is None
    assert record.device_bandwidth_source.startswith("uncalibrated: no ")
    if name == "adamw":  # reads p, g, m, v and writes p, m, v: 28 bytes a parameter, and each tensor's step twice
        assert record.optimizer_step_traffic_bytes == 28 * record.num_params + 2 * record.state_bytes_by_key["step"]
    assert record.job_key["schedule"] == "linear" and record.job_key["device"] == "cpu"


def test_speed_figures_from_known_times():
    """Hand-worked: steps of 0.4-0.6 s at batch 16, optimizer steps of 2-4 ms moving 28 MB against a calibrated
    14 GB/s (the trial's own probe, 50 GB/s here, is never the divisor)."""
    from optbench.probes.bandwidth import BandwidthCalibration
    from optbench.records.record import Record
    from optbench.trial.describe import describe_bandwidth

    record = Record(batch_size=16, optimizer_step_traffic_bytes=28_000_000)
    measure.describe_speed(record, [0.5, 0.4, 0.6, 0.5], [0.004, 0.002, 0.003])
    calibration = BandwidthCalibration(machine="m", device_name="cpu", threads=2, ceiling_bytes_per_s=14e9,
                                       quantiles_bytes_per_s={"0.05": 12e9, "0.5": 14e9, "0.95": 15e9}, passes=200,
                                       buffer_bytes=2**27)
    describe_bandwidth(record, [49e9, 50e9, 51e9], calibration, "file.json")  # the trial's probe reads 50 GB/s
    assert record.device_bandwidth_bytes_per_s == 50e9 and record.device_bandwidth_probe_disagrees
    assert record.step_time_median_s == 0.5 and record.step_time_iqr_s == pytest.approx(0.05)  # 0.525 - 0.475
    assert record.optimizer_step_median_s == 0.003 and record.optimizer_step_iqr_s == pytest.approx(0.001)
    assert record.samples_per_s == pytest.approx(32.0)
    assert record.roofline_fraction == pytest.approx(2 / 3)  # 28 MB in 3 ms is 9.33 GB/s of the 14


def test_torch_optimizers_name_what_torch_runs_on_this_device():
    """On CPU torch has no foreach kernels: the default AdamW runs the per-tensor loop, fused runs fused."""
    default = run_trial(TrialSpec(optimizer="adamw", **TINY))
    fused = run_trial(TrialSpec(optimizer="adamw_fused", **TINY))
    assert (default.optimizer_impl, fused.optimizer_impl) == ("per-tensor loop", "fused")
    assert run_trial(TrialSpec(optimizer="adafactor", **TINY)).optimizer_impl is None  # not torch.optim


def test_huge_learning_rate_is_recorded_as_diverged():
    record = run_trial(TrialSpec(optimizer="adamw", lr=1e4, **TINY))
    assert record.status == "diverged"
    assert "loss" in record.error


def test_a_trial_that_raises_is_an_error_record():
    record = run_trial(TrialSpec(optimizer="adamw", optimizer_kwargs={"betas": (2.0, 0.9)}, **TINY))
    assert record.status == "error"
    assert "beta" in record.error.lower()
    assert record.optimizer == "adamw" and record.steps == 6  # the settings survive the failure


def test_cuda_asked_for_without_cuda_is_an_error_record():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    record = run_trial(TrialSpec(optimizer="adamw", **TINY | {"device": "cuda"}))
    assert record.status == "error" and "CUDA" in record.error


def test_trial_id_is_stable_and_settings_sensitive():
    a, b = TrialSpec(optimizer="adamw", **TINY), TrialSpec(optimizer="adamw", **TINY)
    assert a.trial_id == b.trial_id
    assert a.trial_id != TrialSpec(optimizer="adamw", seed=1, **{k: v for k, v in TINY.items()}).trial_id
    assert a.trial_id == TrialSpec(optimizer="adamw", timeout_s=5, **TINY).trial_id


def test_what_the_probes_could_not_measure_is_kept_on_the_record_once(monkeypatch, tmp_path):
    """A trial runs in a child whose log nobody reads: the probes' warnings travel on its record (each once)."""
    monkeypatch.setattr(measure, "_CLEAR_REFS", tmp_path / "no-such-folder" / "clear_refs")
    monkeypatch.setattr(stream, "_CPU_CACHE", tmp_path)
    record = run_trial(TrialSpec(optimizer="adamw", **TINY))
    assert record.status == "ok", record.error
    cache, rss = record.measurement_warnings  # the bandwidth probe ran twice, the peaks were reset several times
    assert cache.startswith(f"the CPU's cache sizes could not be read from {tmp_path}")
    assert rss.startswith("the peak RSS could not be reset")


def test_a_librarys_own_warning_during_a_trial_is_shown_once_and_not_kept_on_the_record(monkeypatch):
    """Only the probes' warnings travel on the record; a library's (GaLore's FutureWarning, say) is shown as
    usual, once, and the trial goes on (re-showing it inside the catching block caught it again, forever)."""
    import warnings

    samples = stream.stream_bandwidth_samples

    def warning_probe(device, count, *operand):
        warnings.warn("a library's notice", UserWarning, stacklevel=2)
        return samples(device, count, *operand)

    monkeypatch.setattr(stream, "stream_bandwidth_samples", warning_probe)
    with pytest.warns(UserWarning, match="a library's notice") as shown:
        record = run_trial(TrialSpec(optimizer="adamw", **TINY))
    assert record.status == "ok", record.error
    assert record.measurement_warnings == []
    assert len([w for w in shown if "a library's notice" in str(w.message)]) == 2  # one per call: shown, not looped


@pytest.mark.parametrize("probe_agrees", [True, False])
def test_the_roofline_divides_by_the_machines_calibration_and_the_trials_probe_is_checked_against_it(probe_agrees):
    """A calibration file for this machine (in the test session's cache): the roofline is the step's traffic over
    its median time over the calibrated ceiling; a probe outside the calibration's 5-95 % range is flagged."""
    import torch

    from optbench.probes import bandwidth
    from optbench.records.environment import machine_key

    device = torch.device("cpu")
    machine = machine_key(device)
    wide = (1e3, 1e15) if probe_agrees else (1e14, 1e15)  # any probe agrees with the first, none with the second
    calibration = bandwidth.BandwidthCalibration(
        machine=machine, device_name="test", threads=torch.get_num_threads(), ceiling_bytes_per_s=1e11,
        quantiles_bytes_per_s={"0.05": wide[0], "0.25": 1e11, "0.5": 1e11, "0.75": 1e11, "0.95": wide[1]},
        passes=3, buffer_bytes=1, kernel=stream.KERNEL)
    path = bandwidth.save(calibration, bandwidth.default_path(machine))
    try:
        record = run_trial(TrialSpec(optimizer="adamw", **TINY))
    finally:
        path.unlink()
    assert record.status == "ok", record.error
    assert record.device_bandwidth_source == str(path) and record.device_bandwidth_calibrated_bytes_per_s == 1e11
    assert record.roofline_fraction == pytest.approx(record.optimizer_step_traffic_bytes
                                                     / record.optimizer_step_median_s / 1e11)
    assert record.device_bandwidth_calibrated_spread_bytes_per_s == wide[1] - wide[0]
    assert record.device_bandwidth_probe_disagrees is (not probe_agrees)
