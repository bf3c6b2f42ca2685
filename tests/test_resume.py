"""Checkpoint and resume: every registry entry through the save/load the trial's resume check uses, and the check
inside real trials (exact for AdamW, the mode switch for schedule-free, a failing load as a result)."""

import copy
import io
from types import SimpleNamespace

import pytest
import torch
import transformers
from _tiny import TINY, skip_unavailable

from optbench import optimizers
from optbench.job.spec import TrialSpec
from optbench.records.record import Record
from optbench.trial.engines import resume
from optbench.trial.run import run_trial
from optbench.trial.schedules import make_scheduler
from optbench.workloads import tiny_bert_config


def _setup(model, entry):
    optimizer = entry.build_for(model, lr=entry.default_lr)
    return SimpleNamespace(model=model, optimizer=optimizer, scheduler=make_scheduler(optimizer, "linear", 6, 1),
                           scaler=None, device=torch.device("cpu"), entry=entry)


def _train(s, steps, seed):
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, s.model.config.vocab_size, (2, 8), generator=generator)
        loss = s.model(input_ids=ids, labels=torch.tensor([0, 1])).loss
        loss.backward()
        s.optimizer.step()
        s.optimizer.zero_grad()
        s.scheduler.step()
        losses.append(loss.item())
    return losses


# GrokAdamW 0.1.2 keeps its moments in `param_groups[i]["state"]`, keyed by the parameter tensors: state_dict() pickles
# them keyed by the old tensors, and a fresh optimizer never finds them under its own, so a resumed run restarts its
# moments. The resume check is there to catch exactly this; the test holds it to finding it.
NOT_RESUMABLE = {"grokadamw"}


@pytest.mark.parametrize("entry", list(optimizers.REGISTRY.values()), ids=lambda e: e.name)
def test_every_entry_saves_and_resumes_to_the_same_parameters(entry, monkeypatch):
    skip_unavailable(entry)
    if entry.step_in_backward:  # this loop calls optimizer.step(); those entries update inside backward
        pytest.skip(f"{entry.name} updates inside backward: not this loop's (the planner runs it under Trainer only)")
    if entry.library == "torchao":  # the same state tensors, without tens of seconds of compilation
        monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(tiny_bert_config(hidden_size=32))
    fresh_model = copy.deepcopy(model)
    s = _setup(model, entry)
    _train(s, 2, seed=0)
    buffer = io.BytesIO()
    entry.before_eval(s.optimizer)  # what the check does before saving (schedule-free's eval())
    torch.save(resume.capture(s), buffer)
    entry.after_eval(s.optimizer)
    reference = _train(s, 2, seed=1)
    fresh = _setup(fresh_model, entry)
    buffer.seek(0)
    resume.restore(fresh, torch.load(buffer, weights_only=False))
    entry.after_eval(fresh.optimizer)
    resumed = _train(fresh, 2, seed=1)
    record = Record()
    resume.compare(record, resume._params(s.model), resume._params(fresh.model), reference[-1], resumed[-1])
    expected = ("diverged",) if entry.name in NOT_RESUMABLE else ("exact", "close")
    assert record.resume_status in expected, (record.resume_max_abs_param_diff, record.resume_final_loss_diff)


@pytest.mark.parametrize("name", [n for n in ("adamw", "adamw8bit", "adamw_schedulefree")
                                  if optimizers.resolve(n).available])
def test_a_trial_with_the_resume_check_reports_checkpoint_size_times_and_status(name):
    record = run_trial(TrialSpec(optimizer=name, resume_check=True, **{**TINY, "steps": 4}))
    assert record.status == "ok", record.error
    assert record.resume_status == "exact" and record.resume_max_abs_param_diff == 0.0
    # the checkpoint holds the weights and the optimizer state (and the schedule, RNG: a few KiB more)
    assert record.checkpoint_bytes > record.weights_bytes + record.state_bytes
    assert record.checkpoint_save_s > 0 and record.checkpoint_load_s > 0
    assert (record.resume_note is not None) == (name == "adamw_schedulefree")


@pytest.mark.parametrize("engine", ["native", "accelerate"])
def test_the_resume_check_pauses_the_memory_window_at_its_save_alone(engine, monkeypatch):
    """A pause collects garbage, trims the heap and empties the CUDA cache; once a step it cost ~0.2 s a step here,
    and on CUDA the next step had to allocate its blocks again. Only the middle step's save pauses."""
    from optbench.probes import measure

    pauses = []
    paused = measure.MemoryWindow.paused

    def counted(self):
        pauses.append(1)
        return paused(self)

    monkeypatch.setattr(measure.MemoryWindow, "paused", counted)
    record = run_trial(TrialSpec(optimizer="adamw", resume_check=True, engine=engine, **{**TINY, "steps": 6}))
    assert record.status == "ok" and record.resume_status == "exact", record.error
    assert len(pauses) == 1


def test_compare_calls_tiny_differences_close_and_larger_ones_diverged():
    a, record = [torch.zeros(3)], Record()
    resume.compare(record, a, [torch.tensor([0.0, 0.0, 1e-7])], 1.0, 1.0)
    assert record.resume_status == "close"
    resume.compare(record, a, [torch.tensor([0.0, 0.0, 1e-2])], 1.0, 1.1)
    assert record.resume_status == "diverged" and record.resume_max_abs_param_diff == pytest.approx(1e-2)
    resume.compare(record, a, [torch.zeros(3)], 1.0, 1.0)
    assert (record.resume_status, record.resume_final_loss_diff) == ("exact", 0.0)


def test_a_checkpoint_that_cannot_be_loaded_is_an_error_result_with_the_message(monkeypatch):
    def broken_load(*args, **kwargs):
        raise RuntimeError("Error(s) in loading state_dict for AdamW8bit: missing key 'state1'\nmore detail")

    monkeypatch.setattr(resume.torch, "load", broken_load)
    record = run_trial(TrialSpec(optimizer="adamw", resume_check=True, **{**TINY, "steps": 4}))
    assert record.status == "ok"  # the trial's own numbers stand; the resume failure is a result
    assert record.resume_status == "error: RuntimeError: Error(s) in loading state_dict for AdamW8bit: missing key " \
                                   "'state1'"


@pytest.mark.parametrize("name", [n for n in ("adamw", "adamw8bit", "adamw_schedulefree")
                                  if optimizers.resolve(n).available])
def test_under_trainer_the_check_uses_trainers_own_checkpoint_and_resume(name):
    """`--engine trainer`: Trainer writes checkpoint-2 (weights, optimizer.pt, scheduler.pt, RNG, trainer state)
    and a second Trainer resumes from it with `resume_from_checkpoint`; the data loader is fast-forwarded past the
    batches already trained, so the resumed run ends where the uninterrupted one did."""
    record = run_trial(TrialSpec(optimizer=name, resume_check=True, engine="trainer", **{**TINY, "steps": 4}))
    assert record.status == "ok", record.error
    assert record.resume_status == "exact", (record.resume_status, record.resume_max_abs_param_diff)
    assert len(record.loss_curve) == 4 and record.resume_final_loss_diff == 0.0
    assert record.checkpoint_bytes > record.weights_bytes + record.state_bytes
    assert record.checkpoint_save_s > 0 and record.checkpoint_load_s > 0
    assert (record.resume_note is not None) == (name == "adamw_schedulefree")


def test_under_trainer_a_failed_save_is_the_result_and_the_trial_goes_on(monkeypatch):
    def broken(self, output_dir):
        raise RuntimeError("cannot pickle 'OptimState4bit' object\nmore detail")

    monkeypatch.setattr(transformers.Trainer, "_save_optimizer_and_scheduler", broken)
    record = run_trial(TrialSpec(optimizer="adamw", resume_check=True, engine="trainer", **{**TINY, "steps": 4}))
    assert record.status == "ok" and len(record.loss_curve) == 4
    assert record.resume_status == "error: RuntimeError: cannot pickle 'OptimState4bit' object"
    assert record.checkpoint_save_s is None


class Projector:
    """An object in optimizer state, as GaLore's and APOLLO's projectors are."""


def test_a_weights_only_refusal_is_reported_by_the_class_it_refused():
    buffer = io.BytesIO()
    torch.save({"projector": Projector()}, buffer)
    buffer.seek(0)
    with pytest.raises(Exception) as caught:
        torch.load(buffer, weights_only=True)
    message = resume._message(caught.value)
    assert message.startswith("UnpicklingError: WeightsUnpickler error: Unsupported global: GLOBAL ")
    assert "Projector" in message and "\x1b" not in message and len(message) <= 300


@pytest.mark.skipif(not optimizers.resolve("galore_adamw_r8").available, reason="galore-torch is not installed")
def test_under_trainer_galores_projector_state_cannot_be_loaded_weights_only():
    """Trainer loads optimizer.pt with weights_only=True; GaLore keeps projector objects in its state."""
    record = run_trial(TrialSpec(optimizer="galore_adamw_r8", resume_check=True, engine="trainer",
                                 **{**TINY, "steps": 4}))
    assert record.status == "ok" and record.checkpoint_bytes > 0
    assert record.resume_status.startswith("error: UnpicklingError: WeightsUnpickler error: Unsupported global")
    assert "GaLoreProjector" in record.resume_status
