"""The same tiny trial through each engine: identical optimizer state, every record field filled, the same
timed interval, skipped fp16 steps kept out of the figures, and each engine on the trial's own device."""

import contextlib

import pytest
import torch
from _overflow import overflow_at

from optbench import optimizers
from optbench.job.spec import TrialSpec
from optbench.probes.timing import STEP_MARKS, StepSamples, StepTimer
from optbench.trial.engines import ENGINES, get_engine
from optbench.trial.engines.accelerate import placement_agrees
from optbench.trial.engines.trainer import pin_device
from optbench.trial.run import run_trial

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


@pytest.mark.parametrize("engine", ENGINES)
def test_engine_records_an_eval_curve_evaluated_outside_the_memory_window(monkeypatch, engine):
    """An `--eval-every` evaluation (an LM's fp32 logits) can outgrow training: it runs in MemoryWindow.paused()."""
    from optbench.probes import measure
    from optbench.trial.engines import base

    paused, evaluate, inside, evaluated = measure.MemoryWindow.paused, base.evaluate, [False], []

    @contextlib.contextmanager
    def watched(self):
        with paused(self):
            inside[0] = True
            try:
                yield
            finally:
                inside[0] = False

    def recorded(s, split):
        evaluated.append(inside[0])
        return evaluate(s, split)

    monkeypatch.setattr(measure.MemoryWindow, "paused", watched)
    monkeypatch.setattr(base, "evaluate", recorded)  # the curve's; the final evaluation (after training) is not
    record = run_trial(TrialSpec(optimizer="adamw", engine=engine, eval_every=3, **TINY))
    assert record.status == "ok", record.error
    assert [point[0] for point in record.eval_curve] == [3, 6] and evaluated == [True, True]
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


# -- the device and the timed interval: the seams of the CUDA path, exercised on CPU ----------------------------
class TickingClock:
    """A fake step clock: every StepTimer mark advances it by 1 (by `step + 1` with `per_step`, 6 marks a step),
    and copying a batch to the device by 1000. An engine that timed the copy, or added up other intervals than
    the native loop, would show it in its samples."""

    def __init__(self, per_step: bool = False) -> None:
        self.now, self.marks, self.copies, self.per_step = 0.0, 0, 0, per_step

    def install(self, monkeypatch) -> None:
        def mark(timer, name) -> None:
            self.now += self.marks // len(STEP_MARKS) + 1 if self.per_step else 1
            self.marks += 1
            timer.marks[name] = self.now

        monkeypatch.setattr(StepTimer, "mark", mark)

    def copying(self, copy):
        def copied(*args, **kwargs):
            self.now += 1000
            self.copies += 1
            return copy(*args, **kwargs)
        return copied


@pytest.fixture
def ticking(monkeypatch):
    import accelerate.data_loader

    from optbench.trial.engines import loop

    clock = TickingClock()
    clock.install(monkeypatch)
    monkeypatch.setattr(loop, "to_device", clock.copying(loop.to_device))
    monkeypatch.setattr(accelerate.data_loader, "send_to_device", clock.copying(accelerate.data_loader.send_to_device))
    return clock


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_times_the_same_three_intervals_and_not_the_batch_copy(ticking, engine):
    """forward+backward, optimizer.step() and zero_grad+schedule, one tick each: 3 per step, 1 for the optimizer.
    The batch's copy to the device (1000 ticks) falls outside in every engine."""
    record = run_trial(TrialSpec(optimizer="adamw", engine=engine, **TINY))
    assert record.status == "ok", record.error
    assert ticking.marks >= len(STEP_MARKS) * TINY["steps"] and ticking.copies >= TINY["steps"]  # both happened
    assert record.first_step_s == 3.0
    assert record.step_time_samples_s == [3.0] * (TINY["steps"] - TINY["warmup_steps"])
    assert record.optimizer_step_samples_s == [1.0] * (TINY["steps"] - TINY["warmup_steps"])
    assert record.skipped_steps == []


def test_step_samples_keep_skipped_steps_out_of_the_first_step_and_the_medians():
    samples = StepSamples(warmup_steps=2)
    for step, stepped in enumerate([False, False, True, True, False, True]):
        samples.add(step, step_s=10.0 + step, optimizer_s=float(step), stepped=stepped)
    assert samples.first_step_s == 12.0 and samples.first_stepped == 2  # state was created at step 2
    assert samples.skipped_steps == [0, 1, 4]
    assert samples.step_times == [13.0, 15.0] and samples.optimizer_times == [3.0, 5.0]
    plain = StepSamples(warmup_steps=2)
    for step in range(5):
        plain.add(step, step_s=float(step), optimizer_s=0.0)
    assert plain.first_step_s == 0.0 and plain.step_times == [2.0, 3.0, 4.0]  # what StepLog always kept


def test_native_fp16_skipped_steps_stay_out_of_first_step_and_medians(monkeypatch):
    from optbench.probes import stream

    TickingClock(per_step=True).install(monkeypatch)  # step k's marks tick by k + 1: its time says which step
    # no marks but the steps'
    monkeypatch.setattr(stream, "stream_bandwidth_samples", lambda device, samples, operand=None: [])
    overflow_at(monkeypatch, {0, 3}, cpu_scaler=True)  # a GradScaler on CPU, inf gradients at steps 0, 3
    record = run_trial(TrialSpec(optimizer="adamw", precision="fp16-autocast", fidelity=True,
                                 **{**TINY, "warmup_steps": 1}))
    assert record.status == "ok", record.error
    assert record.skipped_steps == [0, 3]
    assert record.first_step_s == 3 * 2  # step 1 made the state
    assert record.step_time_samples_s == [3 * 3, 3 * 5, 3 * 6]  # steps 2, 4, 5
    assert record.optimizer_step_samples_s == [3, 5, 6]
    # the shadow AdamW skipped with the real step and stayed finite: every other step reads AdamW against itself
    assert [c is None for c in record.update_cosine_curve] == [True, False, False, True, False, False]
    assert all(c == pytest.approx(1.0, abs=1e-5) for c in record.update_cosine_curve if c is not None)


def test_accelerate_places_the_model_where_the_trial_runs():
    cuda = torch.device("cuda", 1)
    assert placement_agrees(cuda, cuda, current_index=0)
    assert not placement_agrees(torch.device("cuda", 0), cuda, current_index=0)  # the bug: default GPU vs cuda:1
    assert placement_agrees(torch.device("cuda"), cuda, current_index=1)  # "cuda" is the current GPU
    assert not placement_agrees(torch.device("cuda"), cuda, current_index=0)
    assert placement_agrees(torch.device("cpu"), torch.device("cpu"), current_index=None)
    assert not placement_agrees(torch.device("cpu"), cuda, current_index=1)


def test_trainer_is_pinned_to_the_trials_gpu_and_never_data_parallel(monkeypatch):
    """Checked against the installed transformers: TrainingArguments keeps its device in the cached property
    `_setup_devices` and the GPU count in `_n_gpu` (>1 makes Trainer wrap the model in nn.DataParallel)."""
    import functools

    from transformers import TrainingArguments

    assert isinstance(TrainingArguments.__dict__["_setup_devices"], functools.cached_property)
    made_current = []
    monkeypatch.setattr(torch.cuda, "set_device", made_current.append)
    args = TrainingArguments("unused", use_cpu=True, report_to=[])
    args._n_gpu = 4  # what _setup_devices sets on a 4-GPU machine outside a distributed launch
    assert pin_device(args, torch.device("cuda", 2)) is args
    assert args.device == torch.device("cuda", 2) and args.n_gpu == 1 and made_current == [torch.device("cuda", 2)]
    cpu_args = TrainingArguments("unused", use_cpu=True, report_to=[])
    assert pin_device(cpu_args, torch.device("cpu")).device.type == "cpu" and cpu_args.n_gpu == 0
