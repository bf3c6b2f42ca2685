"""Workloads as units: the registry, a toy workload from one file, the causal LM, precision, the tune split."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from optbench import workloads
from optbench.job.spec import TrialSpec
from optbench.trial.run import run_trial
from optbench.workloads.base import Built, Workload, carve_validation

TINY = dict(workload="tiny", device="cpu", steps=6, warmup_steps=2, batch_size=4, seq_len=16, eval_size=24)
LM = dict(workload="lm", device="cpu", steps=4, warmup_steps=1, batch_size=4, seq_len=16, eval_size=64)


class ToyRegression(Workload):
    """A workload defined in one place: a linear model fitting y = 3x; metric mse, smaller is better."""

    name = "toy"
    target_metric = "mse"
    target_mode = "min"

    def build(self, spec: TrialSpec) -> Built:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(256, 8, generator=generator)
        data = {"x": x, "y": 3 * x.sum(-1, keepdim=True)}
        return Built(model=torch.nn.Linear(8, 1), model_name="linear-8", dataset_name="y=3x", train=data,
                     val=None, eval={k: v[:64] for k, v in data.items()}, chance_loss=100.0, pretrained=False)

    def loss(self, model: torch.nn.Module, batch) -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])

    def evaluate(self, model, split, device) -> dict[str, float]:
        with torch.no_grad():
            return {"mse": self.loss(model, {k: v.to(device) for k, v in split.items()}).item()}


def test_a_toy_workload_registered_from_one_file_runs_a_trial(monkeypatch):
    monkeypatch.setitem(workloads.WORKLOADS, "toy", ToyRegression())
    record = run_trial(TrialSpec(optimizer="adamw", workload="toy", device="cpu", steps=20, warmup_steps=2,
                                 batch_size=16, lr=0.05, eval_every=10))
    assert record.status == "ok", record.error
    assert record.target_metric == "mse" and record.target_mode == "min"
    assert set(record.eval_metrics) == {"mse"} and record.eval_accuracy is None
    assert record.state_bytes == record.analytic_state_bytes == 2 * 4 * 9 + 2 * 4
    assert [point[0] for point in record.eval_curve] == [10, 20]
    assert record.eval_curve[-1][2] < record.eval_curve[0][2]  # mse falls as it trains


def test_unknown_workload_names_the_known_ones():
    with pytest.raises(workloads.WorkloadError, match="known: minilm, tiny, custom, lm"):
        workloads.get_workload("huge")
    with pytest.raises(workloads.WorkloadError, match="no option depth; its options: hidden_size"):
        workloads.get_workload("tiny").check(TrialSpec(optimizer="adamw", workload="tiny",
                                                       workload_options={"depth": 3}))
    with pytest.raises(workloads.WorkloadError, match="multiple of 32"):
        workloads.get_workload("tiny").check(TrialSpec(optimizer="adamw", workload="tiny",
                                                       workload_options={"hidden_size": 48}))


def test_schema_1_width_in_the_name_reads_back_as_an_option():
    from optbench.records.record import Record

    record = Record.from_dict({"schema_version": 1, "trial_id": "t", "optimizer": "adamw", "workload": "tiny-w128"})
    assert (record.workload, record.workload_options, record.schedule) == ("tiny", {"hidden_size": 128}, "constant")
    assert record.job_key["workload_options"] == {"hidden_size": 128}


def test_causal_lm_trial_reports_perplexity_and_learns():
    record = run_trial(TrialSpec(optimizer="adamw", **LM | {"steps": 12}))
    assert record.status == "ok", record.error
    assert record.target_metric == "perplexity" and record.target_mode == "min"
    assert set(record.eval_metrics) == {"loss", "perplexity", "token_accuracy"}
    assert record.eval_metrics["perplexity"] == pytest.approx(math.exp(record.eval_metrics["loss"]))
    assert record.pretrained is False and record.model.startswith("llama")
    assert 10e6 < record.num_params < 20e6  # nearly all in the decoder layers (a 1,024-id vocabulary)
    assert record.metric_ceiling < record.eval_metrics["perplexity"]  # the Markov corpus's floor is below any model
    # From random init the loss starts near log(vocab) and falls within a dozen steps at the scaled lr.
    assert record.loss_curve[0] > record.train_loss_final
    assert record.lr == pytest.approx(20 * 5e-5)


@pytest.mark.parametrize("precision,param_dtype,autocast_dtype", [
    ("bf16-autocast", "float32", "bfloat16"),
    ("bf16", "bfloat16", None),
    ("fp16-autocast", "float32", "float16"),
])
def test_precision_modes_run_on_cpu_and_say_so(precision, param_dtype, autocast_dtype):
    record = run_trial(TrialSpec(optimizer="adamw", precision=precision, **TINY))
    assert record.status == "ok", record.error
    assert (record.precision, record.param_dtype, record.autocast_dtype) == (precision, param_dtype, autocast_dtype)
    bytes_per_weight = 2 if param_dtype == "bfloat16" else 4
    assert record.weights_bytes == record.grads_bytes == bytes_per_weight * record.num_params
    # torch's AdamW keeps its moments in the parameters' dtype, and the label says which
    assert record.state_precision == ("bf16" if param_dtype == "bfloat16" else "fp32")
    assert record.state_bytes == record.analytic_state_bytes
    assert record.state_bytes_per_param == pytest.approx(2 * bytes_per_weight, rel=0.01)


def test_every_trial_trains_without_the_validation_rows_and_study_trials_score_both_splits():
    spec = TrialSpec(optimizer="adamw", stage="tune", **TINY)
    built = workloads.get_workload("tiny").build(spec)
    run = workloads.get_workload("tiny").build(TrialSpec(optimizer="adamw", **TINY))
    assert run.val is None and run.val_chance is None  # a plain run is not scored on validation...
    # the tune stage is judged against the validation split's own chance level, not the eval split's
    labels = built.val["labels"].tolist()
    assert built.val_chance == max(labels.count(label) for label in set(labels)) / len(labels)
    assert torch.equal(built.train["input_ids"], run.train["input_ids"])  # ...but trains on the same rows
    assert built.train["input_ids"].shape[0] + built.val["input_ids"].shape[0] == 4000
    assert torch.equal(built.eval["input_ids"], run.eval["input_ids"])  # the same eval rows as a plain run
    record = run_trial(spec)
    assert record.status == "ok", record.error
    assert record.val_rows == built.val["input_ids"].shape[0] == 400  # 10 % of the 4,000 training rows
    assert record.val_metric == record.val_accuracy == record.val_metrics["accuracy"]
    assert record.val_chance == built.val_chance
    assert record.eval_accuracy == record.eval_metrics["accuracy"]


def test_a_run_at_a_studys_lr_repeats_that_studys_trial():
    """Same job, seed and lr: a plain run and a study's tune trial train alike, so they score alike (`run` at the
    tuned lr reproduces the study's seed-0 final)."""
    settings = dict(TINY, lr=1e-3, seed=3)
    run = run_trial(TrialSpec(optimizer="adamw", **settings))
    tune = run_trial(TrialSpec(optimizer="adamw", stage="tune", **settings))
    assert run.status == tune.status == "ok"
    assert run.loss_curve == pytest.approx(tune.loss_curve, rel=1e-6)
    assert run.eval_metrics == pytest.approx(tune.eval_metrics, rel=1e-6)
    assert run.trial_id != tune.trial_id


def test_validation_rows_are_fixed_and_disjoint_from_training_rows():
    train = {"i": torch.arange(100)}
    rest, val = carve_validation(train, 0.1)
    again_rest, again_val = carve_validation(train, 0.1)
    assert torch.equal(val["i"], again_val["i"]) and len(val["i"]) == 10
    assert not set(val["i"].tolist()) & set(rest["i"].tolist())


def test_time_to_target_is_read_from_the_eval_curve():
    record = run_trial(TrialSpec(optimizer="adamw", eval_every=2, target=0.0, **TINY))
    assert record.status == "ok", record.error
    assert record.steps_to_target == 2 and record.time_to_target_s == record.eval_curve[0][1]
    unreachable = run_trial(TrialSpec(optimizer="adamw", eval_every=2, target=1.01, **TINY))
    assert unreachable.steps_to_target is None and unreachable.time_to_target_s is None


def test_length_sorted_evaluation_scores_what_full_width_batches_score():
    """Eval batches drop the columns all their rows pad and come in length order: the tiny BERT's logits match a
    full-width forward row for row, and accuracy and F1 are unchanged (labels travel with their rows)."""
    from optbench.workloads.base import length_sorted_batches
    from optbench.workloads.classify import classification_metrics

    torch.manual_seed(0)
    built = workloads.get_workload("tiny").build(TrialSpec(optimizer="adamw", **{**TINY, "seq_len": 64}))
    model, split = built.model.eval(), built.eval
    lengths = split["attention_mask"].sum(1)
    assert lengths.min() < lengths.max() <= split["input_ids"].shape[1]  # the split has padding to drop
    with torch.no_grad():
        full = model(**{k: v for k, v in split.items() if k != "labels"}).logits
        batches = list(length_sorted_batches(split, torch.device("cpu"), batch_size=8))
        sorted_logits = torch.cat([model(**{k: v for k, v in b.items() if k != "labels"}).logits for b in batches])
    order = torch.argsort(lengths, stable=True)
    assert [b["input_ids"].shape[1] for b in batches] == sorted(b["input_ids"].shape[1] for b in batches)
    assert batches[0]["input_ids"].shape[1] < split["input_ids"].shape[1]
    torch.testing.assert_close(sorted_logits, full[order], atol=1e-5, rtol=1e-4)
    labels = torch.cat([b["labels"] for b in batches])
    assert torch.equal(labels, split["labels"][order])
    expected = classification_metrics(full.argmax(-1), split["labels"], 3)
    assert workloads.get_workload("tiny").evaluate(model, split, torch.device("cpu")) == expected


class _Perfect(torch.nn.Module):
    """A 2-class model that is always right: the label sits in the first token (what evaluation feeds it)."""

    def forward(self, input_ids, attention_mask=None):
        return type("Out", (), {"logits": torch.nn.functional.one_hot(input_ids[:, 0], 2).float()})()


def test_the_registrys_classification_keeps_no_state_of_one_trials_build():
    """The registry holds one object per workload, shared by every trial of a process: building the 3-class tiny
    job must not change how a 2-class model is scored afterwards (macro-F1 over its own head's 2 classes)."""
    classification = workloads.get_workload("tiny")
    classification.build(TrialSpec(optimizer="adamw", **TINY))  # the embedded task: 3 classes
    labels = torch.tensor([0, 1, 1, 0])
    split = {"input_ids": torch.stack([labels, labels], 1), "attention_mask": torch.ones(4, 2, dtype=torch.long),
             "labels": labels}
    assert classification.evaluate(_Perfect(), split, torch.device("cpu")) == {"accuracy": 1.0, "f1": 1.0}


def test_a_workloads_names_and_metadata_need_no_torch():
    """What a record of a trial that never ran holds (model, dataset, target metric, lr scale) comes from the
    workload without importing torch or datasets: the sweep writes such records (skipped, timeout) itself."""
    import subprocess
    import sys

    code = ("import sys; from optbench.workloads import get_workload; from optbench.job.spec import TrialSpec; "
            "w = get_workload('lm'); s = TrialSpec(optimizer='adamw', workload='lm'); "
            "print(w.model_name(s), w.dataset_name(s), w.lr_scale(s), w.target_metric, "
            "[m for m in ('torch', 'datasets', 'transformers') if m in sys.modules])")
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": root}).stdout
    assert out.split() == ["llama-h512-l4", "markov-chain", "20.0", "perplexity", "[]"]
