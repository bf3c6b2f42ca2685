"""OptbenchCallback on a plain Trainer run: the README's example, run as written on the tiny BERT."""

import json
from pathlib import Path

import numpy as np
import pytest

from optbench import optimizers
from optbench.engines.trainer import SplitDataset
from optbench.plan import TrialSpec
from optbench.results import read_records
from optbench.workloads import get_workload

# The README's example, verbatim: a user's Trainer run plus one callback.
README_EXAMPLE = """
from transformers import Trainer, TrainingArguments
from optbench.integrations import OptbenchCallback

args = TrainingArguments("out", max_steps=20, eval_strategy="steps", eval_steps=20,
                         use_cpu=True, report_to=[])
trainer = Trainer(model=model, args=args, train_dataset=train_dataset,
                  eval_dataset=eval_dataset, compute_metrics=compute_metrics,
                  callbacks=[OptbenchCallback("results/my-run.jsonl", optimizer_name="adamw_torch")])
trainer.train()
# then: python -m optbench report results/my-run.jsonl
"""


def compute_metrics(prediction):
    return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}


@pytest.fixture
def user_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    built = get_workload("tiny").build(TrialSpec(optimizer="adamw", workload="tiny", seq_len=16, eval_size=32))
    namespace = {"model": built.model, "train_dataset": SplitDataset(built.train),
                 "eval_dataset": SplitDataset(built.eval), "compute_metrics": compute_metrics}
    exec(README_EXAMPLE, namespace)
    return namespace["trainer"], tmp_path / "results" / "my-run.jsonl"


def test_readme_example_appends_one_record(user_run):
    trainer, path = user_run
    [record] = read_records(path)
    assert record.status == "ok" and record.engine == "trainer" and record.optimizer == "adamw_torch"
    adamw = optimizers.resolve("adamw").analytic_for(trainer.model)
    assert record.state_bytes == record.analytic_state_bytes == adamw.state_bytes
    assert record.state_precision == "fp32"  # adamw_torch is the registry's adamw
    assert set(record.state_bytes_by_key) == {"exp_avg", "exp_avg_sq", "step"}
    assert record.num_params == sum(p.numel() for p in trainer.model.parameters())
    assert record.peak_rss_bytes > 0 and record.peak_rss_growth_bytes is not None
    assert record.first_step_s > 0 and len(record.step_time_samples_s) == 20 - 5  # steps 5..19
    assert record.step_time_median_s > record.optimizer_step_median_s > 0
    assert 0 <= record.eval_accuracy <= 1 and "loss" in record.eval_metrics
    assert record.steps == 20 and record.batch_size == 8 and record.env["transformers"]
    assert json.loads(path.read_text())["trial_id"] == ""  # a user's run, not one of optbench's trials


def test_records_accumulate_across_runs(user_run):
    trainer, path = user_run
    trainer.train()
    assert len(read_records(path)) == 2


def test_readme_holds_the_example_as_tested():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert README_EXAMPLE.strip() in readme
