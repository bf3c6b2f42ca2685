"""Update fidelity against a shadow fp32 AdamW, the untimed probe, and the probe under a GradScaler."""

import pytest
import torch
from _overflow import overflowing

from optbench import optimizers
from optbench.job.spec import TrialSpec
from optbench.probes.fidelity import UpdateFidelity, reference_settings
from optbench.probes.timing import StepTimer
from optbench.trial.precision import unscale_and_check
from optbench.trial.run import run_trial

TINY = dict(workload="tiny", device="cpu", steps=4, warmup_steps=1, batch_size=4, seq_len=16, eval_size=16)


@pytest.fixture(scope="module")
def fidelity_records():
    names = [n for n in ("adamw", "adafactor", "adamw8bit") if optimizers.resolve(n).available]
    return {name: run_trial(TrialSpec(optimizer=name, fidelity=True, **TINY)) for name in names}


def test_adamw_against_itself_is_exact(fidelity_records):
    record = fidelity_records["adamw"]
    assert record.status == "ok", record.error
    assert record.fidelity is True
    assert len(record.update_cosine_curve) == len(record.update_rel_error_curve) == TINY["steps"]
    assert record.update_cosine_median == pytest.approx(1.0, abs=1e-6)
    assert record.update_rel_error_median == pytest.approx(0.0, abs=1e-6)
    assert all(c == pytest.approx(1.0, abs=1e-6) for c in record.update_cosine_curve)


def test_8bit_is_close_and_adafactor_is_far(fidelity_records):
    # Measured on this workload: adamw8bit cosine ~0.998 (rel. error ~0.05); adafactor (no momentum,
    # factored second moment) cosine ~0.5 and rel. error > 1 — its update is a different direction.
    if "adamw8bit" not in fidelity_records:
        pytest.skip("bitsandbytes is not installed")
    eight_bit, adafactor = fidelity_records["adamw8bit"], fidelity_records["adafactor"]
    assert eight_bit.status == adafactor.status == "ok"
    assert 0.9 < eight_bit.update_cosine_median < 1.0 - 1e-6
    assert 0.0 < eight_bit.update_rel_error_median < 0.3
    assert adafactor.update_cosine_median < 0.9
    assert adafactor.update_rel_error_median > 0.5


def test_probing_does_not_change_training(fidelity_records):
    plain = run_trial(TrialSpec(optimizer="adamw", **TINY))
    probed = fidelity_records["adamw"]
    assert plain.loss_curve == probed.loss_curve  # the shadow neither touches grads nor params
    assert plain.state_bytes == probed.state_bytes  # and its own state is not counted as the optimizer's
    assert plain.fidelity is False and plain.update_cosine_median is None and plain.update_cosine_curve == []
    assert plain.trial_id != TrialSpec(optimizer="adamw", fidelity=True, **TINY).trial_id


def test_probe_time_is_outside_the_timed_intervals(monkeypatch):
    # A fake clock ticks 1 per reading; the probe advances it by 1000. Probe inside a timed interval
    # would put >= 1000 into step or optimizer time.
    now = [0.0]

    def tick(timer, name):
        now[0] += 1.0
        timer.marks[name] = now[0]

    def slow(method):
        def wrapped(self, *args, **kwargs):
            now[0] += 1000.0
            return method(self, *args, **kwargs)
        return wrapped

    monkeypatch.setattr(StepTimer, "mark", tick)
    monkeypatch.setattr(UpdateFidelity, "before_step", slow(UpdateFidelity.before_step))
    monkeypatch.setattr(UpdateFidelity, "after_step", slow(UpdateFidelity.after_step))
    record = run_trial(TrialSpec(optimizer="adamw", fidelity=True, **TINY))
    assert record.status == "ok", record.error
    assert record.first_step_s == record.step_time_median_s == 3.0  # three timed intervals, each between adjacent marks
    assert record.optimizer_step_median_s == 1.0


def test_reference_settings_mirror_what_the_group_has():
    adamw_like = {"lr": 1e-3, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1, "amsgrad": False}
    assert reference_settings(adamw_like) == {"lr": 1e-3, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}
    adafactor_like = {"lr": 3e-4, "eps": (1e-30, 1e-3), "beta1": None, "weight_decay": 0.0}
    assert reference_settings(adafactor_like) == {"lr": 3e-4, "weight_decay": 0.0}


def _scaled_backward(model, scaler, inputs, poison=False):
    loss = model(inputs).square().mean()
    scaler.scale(overflowing(loss) if poison else loss).backward()


def test_shadow_steps_on_unscaled_gradients_and_skips_with_the_real_step():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    probe = UpdateFidelity(optimizer)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    inputs = torch.randn(8, 4)
    for poison in (True, False):  # an overflowing first step, then a good one
        _scaled_backward(model, scaler, inputs, poison)
        stepped = unscale_and_check(scaler, optimizer)
        grads = [p.grad.clone() for p in model.parameters()]
        probe.before_step(skip=not stepped)
        scaler.step(optimizer)
        probe.after_step()
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        assert stepped is not poison
    assert probe.cosines[0] is None and probe.rel_errors[0] is None  # the skipped step has no reading
    assert probe.cosines[1] == pytest.approx(1.0, abs=1e-6) and probe.rel_errors[1] == pytest.approx(0.0, abs=1e-5)
    # the shadow's first moment after its one step is (1 - beta1) x the *unscaled* gradient, finite
    moments = [probe.shadow.state[p]["exp_avg"] for p in probe._shadow_params]
    for moment, grad in zip(moments, grads, strict=True):
        assert torch.allclose(moment, 0.1 * grad, atol=1e-7)
    assert all(int(probe.shadow.state[p]["step"]) == 1 for p in probe._shadow_params)


def test_trial_records_the_peak_split(fidelity_records):
    """The trial fills the split (its arithmetic: the hand-worked tests above): a CPU peak holds at least the weights
    on top of what the process grew by, and the parts it is split into cover it, none negative."""
    record = fidelity_records["adamw"]
    assert record.peak_cuda_allocated_bytes is None and record.peak_rss_growth_bytes >= 0
    assert record.peak_memory_bytes >= record.weights_bytes == 4 * record.num_params
    assert record.other_peak_bytes >= 0
    parts = record.weights_bytes + record.grads_bytes + record.state_bytes + record.other_peak_bytes
    assert parts >= record.peak_memory_bytes


def test_cli_fidelity_flag_reaches_the_spec():
    from optbench.cli.options import build_parser
    from optbench.job import planner
    from optbench.job.spec import PRESETS

    args = build_parser().parse_args(["run", "--fidelity", "--workload", "tiny", "--optimizers", "adamw"])
    specs = planner.plan_run(vars(args), PRESETS[args.preset], args.optimizers, args.seeds).specs
    assert [s.fidelity for s in specs] == [True]
