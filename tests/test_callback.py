"""OptbenchCallback on a plain Trainer run: the README's example, read from README.md and run on the tiny BERT; and
its fp16 path (a GradScaler's unscale before the optimizer-step mark, skipped steps) driven step by step."""

import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from _overflow import overflowing
from torch.amp.grad_scaler import OptState

from optbench import optimizers
from optbench.job.spec import TrialSpec
from optbench.records.record import read_records
from optbench.trial.callback import OptbenchCallback
from optbench.trial.engines.trainer import SplitDataset
from optbench.trial.run import run_trial
from optbench.workloads import get_workload

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    """The README's example as the README holds it (the one python block using the callback): what runs below."""
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
              if "OptbenchCallback(" in b]
    assert len(blocks) == 1, f"{len(blocks)} README examples use OptbenchCallback"
    return blocks[0]


def compute_metrics(prediction):
    return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}


@pytest.fixture
def user_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    built = get_workload("tiny").build(TrialSpec(optimizer="adamw", workload="tiny", seq_len=16, eval_size=32))
    namespace = {"model": built.model, "train_dataset": SplitDataset(built.train),
                 "eval_dataset": SplitDataset(built.eval), "compute_metrics": compute_metrics}
    exec(readme_example(), namespace)
    return namespace["trainer"], tmp_path / "results" / "my-run.jsonl"


def test_readme_example_appends_one_record(user_run):
    trainer, path = user_run
    [record] = read_records(path)
    assert record.status == "ok" and record.engine == "trainer"
    assert record.optimizer == trainer.args.optim.value  # what Trainer built (its default: adamw_torch_fused)
    adamw = optimizers.resolve("adamw").analytic_for(trainer.model)
    assert record.state_bytes == record.analytic_state_bytes == adamw.state_bytes
    assert record.state_precision == "fp32"  # Trainer's AdamW is the registry's adamw, fused or not
    assert record.dataset == "my-reviews" and record.seq_len == 128  # the settings the example gives
    assert set(record.state_bytes_by_key) == {"exp_avg", "exp_avg_sq", "step"}
    assert record.num_params == sum(p.numel() for p in trainer.model.parameters())
    assert record.peak_rss_bytes > 0 and record.peak_rss_growth_bytes is not None
    assert record.first_step_s > 0 and len(record.step_time_samples_s) == 20 - 5  # steps 5..19
    assert record.step_time_median_s > record.optimizer_step_median_s > 0
    assert 0 <= record.eval_accuracy <= 1 and "loss" in record.eval_metrics
    assert record.steps == 20 and record.batch_size == 8 and record.env["transformers"]
    assert json.loads(path.read_text())["trial_id"] == ""  # a user's run, not one of optbench's trials


def test_a_users_trainer_run_is_described_as_a_trial_is(user_run):
    """The callback and the trial fill a record through the same functions (trial/describe.py): the figures a
    trial of the trainer engine carries, a user's run carries too, computed the same way."""
    trainer, path = user_run
    [record] = read_records(path)
    trial = run_trial(TrialSpec(optimizer="adamw", engine="trainer", workload="tiny", device="cpu", steps=3,
                                warmup_steps=1, batch_size=4, seq_len=16, eval_size=16))
    assert trial.status == "ok", trial.error
    described = ("factored_numel", "analytic_state_bytes_per_param", "fp32_state_fraction",
                 "optimizer_step_traffic_bytes", "paged_state_bytes", "optimizer_impl", "state_bytes_per_param",
                 "peak_memory_bytes", "other_peak_bytes", "first_step_s", "samples_per_s")
    assert [name for name in described if getattr(trial, name) is None] == []
    assert [name for name in described if getattr(record, name) is None] == []
    assert set(record.state_bytes_by_module) == set(trial.state_bytes_by_module)
    assert sum(record.state_bytes_by_module.values()) == record.state_bytes
    assert record.factored_numel == trial.factored_numel  # the same tiny BERT, counted the same way


TINY_JOB = TrialSpec(optimizer="adamw", workload="tiny", seq_len=16, eval_size=32)


def _trainer_run(tmp_path, callback, own_optimizer=None, **arguments) -> None:
    """Three steps of a plain Trainer on the tiny BERT; `own_optimizer(model)`: an optimizer passed to Trainer."""
    from transformers import Trainer, TrainingArguments

    built = get_workload("tiny").build(TINY_JOB)
    args = TrainingArguments(str(tmp_path / "out"), max_steps=3, use_cpu=True, report_to=[], **arguments)
    passed = (own_optimizer(built.model), None) if own_optimizer else (None, None)
    Trainer(model=built.model, args=args, train_dataset=SplitDataset(built.train), callbacks=[callback],
            optimizers=passed).train()


def test_the_optimizer_trainer_built_names_the_record_over_a_wrong_name(tmp_path):
    """With optim="sgd", a callback told "adamw_torch" recorded adamw_torch: its name, precision and analytic
    state were another optimizer's, and only `= analytic: no` hinted at it."""
    with pytest.warns(UserWarning, match=r"optimizer_name 'adamw_torch' is not what Trainer trained with "
                                         r"\(optim='sgd', SGD\): the record says 'sgd'"):
        _trainer_run(tmp_path, OptbenchCallback(tmp_path / "r.jsonl", optimizer_name="adamw_torch"), optim="sgd")
    [record] = read_records(tmp_path / "r.jsonl")
    assert record.optimizer == "sgd" and record.state_bytes == record.analytic_state_bytes == 0


@pytest.mark.parametrize("name, said", [("rmsprop", "rmsprop"), ("", "RMSprop")])
def test_an_optimizer_passed_to_trainer_keeps_the_name_given_or_its_class(tmp_path, name, said):
    """Trainer's `optim` (its default) did not build it: the name given stands, or else the optimizer's class."""
    path = tmp_path / "r.jsonl"
    _trainer_run(tmp_path, OptbenchCallback(path, optimizer_name=name),
                 own_optimizer=lambda model: torch.optim.RMSprop(model.parameters(), lr=1e-3))
    [record] = read_records(path)
    assert record.optimizer == said


def test_records_accumulate_across_runs(user_run):
    trainer, path = user_run
    trainer.train()
    assert len(read_records(path)) == 2


def test_fp16_unscale_happens_before_the_optimizer_mark_and_a_skipped_step_is_kept_out():
    """Trainer calls the callback around AcceleratedOptimizer.step(), which runs scaler.step + scaler.update; the
    callback unscales and reads the inf check before its optimizer-step mark (once: clipping may have done it)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    wrapped = SimpleNamespace(scaler=scaler, optimizer=inner)  # what Accelerate hands Trainer's callbacks
    callback, args = OptbenchCallback(warmup_steps=0), SimpleNamespace(device=torch.device("cpu"))
    callback.on_train_begin(args, None, None)
    for step, (poison, clipped) in enumerate([(True, False), (False, False), (False, True), (False, False)]):
        state = SimpleNamespace(global_step=step + 1)
        callback.on_step_begin(args, state, None)
        loss = model(torch.randn(3, 4)).sum()
        scaler.scale(overflowing(loss) if poison else loss).backward()
        if clipped:
            scaler.unscale_(inner)  # Trainer's gradient clipping unscales first
        callback.on_pre_optimizer_step(args, state, None, optimizer=wrapped)
        assert scaler._per_optimizer_states[id(inner)]["stage"] is OptState.UNSCALED
        assert "step" in callback._timer.marks and "stepped" not in callback._timer.marks
        scaler.step(inner)
        scaler.update()
        callback.on_optimizer_step(args, state, None, optimizer=wrapped)
        inner.zero_grad(set_to_none=True)
        callback.on_step_end(args, state, None)
    assert callback.samples.skipped_steps == [0]
    assert callback.samples.first_stepped == 1 and callback.samples.first_step_s > 0
    assert len(callback.samples.step_times) == len(callback.samples.optimizer_times) == 2  # steps 2 and 3
