"""One trial in this process on the tiny BERT: every record field filled, failures become statuses."""

import pytest

from optbench import optimizers
from optbench.job.spec import TrialSpec
from optbench.probes import measure
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
    assert len(record.loss_curve) == 6 and record.train_loss_final == pytest.approx(sum(record.loss_curve[-5:]) / 5)
    assert record.first_step_s > 0 and record.step_time_median_s > record.optimizer_step_median_s > 0
    assert len(record.step_time_samples_s) == 4  # steps 2 to 5: the steps after the 2 warm-up steps
    assert (record.step_time_median_s, record.step_time_iqr_s) == measure.median_iqr(record.step_time_samples_s)
    assert record.samples_per_s == pytest.approx(4 / record.step_time_median_s)
    assert round(record.eval_accuracy * 24) == pytest.approx(record.eval_accuracy * 24)  # scored on 24 rows
    assert record.eval_accuracy == record.eval_metrics["accuracy"] and record.eval_f1 == record.eval_metrics["f1"]
    assert record.env["torch"] and record.env["transformers"] and "git_commit" in record.env
    assert record.lr == optimizers.resolve(name).default_lr
    # where the state sits, and what the held memory holds besides grads and state
    assert sum(record.state_bytes_by_module.values()) == record.state_bytes
    assert record.held_other_bytes == record.rss_growth_after_step_bytes - record.grads_bytes - record.state_bytes
    # the roofline: the step's analytic traffic over its median time, against the triad bandwidth measured here
    assert record.device_bandwidth_bytes_per_s > 0 and record.device_bandwidth_iqr_bytes_per_s is not None
    assert record.roofline_fraction == pytest.approx(record.optimizer_step_traffic_bytes
                                                     / record.optimizer_step_median_s
                                                     / record.device_bandwidth_bytes_per_s)
    assert record.job_key["schedule"] == "linear" and record.job_key["device"] == "cpu"


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
