"""The shipped table of tuned lrs: generated from study files, looked up by `run`, and its source printed."""

import json

import pytest

from optbench import optimizers
from optbench.__main__ import main
from optbench.job import tuned
from optbench.job.spec import TrialSpec
from optbench.records.record import Record, append_record
from optbench.workflows import tuned_lrs
from optbench.workloads import LR_DEFAULT, lr_for

JOB = dict(workload="tiny", steps=6, warmup_steps=1, batch_size=4, seq_len=16, eval_size=32, device="cpu")
CHOSEN = {"adamw": 3e-4, "adafactor": 3e-3}


def _study_file(path):
    """A constructed study of the tiny job: adamw tuned over two lrs and adafactor over one, then seed 1's finals."""
    for name, grid in (("adamw", (5e-5, 3e-4)), ("adafactor", (3e-3,))):
        for lr in grid:
            _append(path, TrialSpec(optimizer=name, lr=lr, seed=0, stage="tune", **JOB),
                    0.8 if lr == CHOSEN[name] else 0.6)
        _append(path, TrialSpec(optimizer=name, lr=CHOSEN[name], seed=1, stage="final", **JOB), 0.79)
    return path


def _append(path, spec, value, chance=None):
    from optbench.trial.settings import settings_record

    record = settings_record(spec)
    record.status, record.val_rows, record.val_metric, record.metric_chance = "ok", 400, value, chance
    record.val_metrics = {"accuracy": value}
    record.eval_metrics, record.eval_accuracy = {"accuracy": value}, value
    append_record(path, record)


@pytest.fixture
def table(tmp_path, monkeypatch):
    """The table generated from the constructed study, in place of the shipped one."""
    study = _study_file(tmp_path / "study.jsonl")
    path = tmp_path / "tuned-lrs.json"
    path.write_text(tuned_lrs.table_text([study], root=tmp_path))
    monkeypatch.setattr(tuned, "TABLE", path)
    return path


def test_the_table_is_generated_from_the_studys_finals(table):
    data = json.loads(table.read_text())
    assert data["sources"] == ["study.jsonl"]
    assert {e["optimizer"]: e["lr"] for e in data["entries"]} == CHOSEN
    assert all(e["source"] == "study.jsonl" and e["job"]["steps"] == 6 for e in data["entries"])
    assert tuned_lrs.table_text([table.parent / "study.jsonl"], root=table.parent) == table.read_text()


def test_an_optimizer_whose_finals_all_ended_at_chance_gets_no_tuned_lr(tmp_path):
    """The positive control's SGD: the study chose its best lr, and at it SGD did not train."""
    study = _study_file(tmp_path / "study.jsonl")
    for seed, stage in ((0, "tune"), (1, "final")):
        _append(study, TrialSpec(optimizer="sgd_momentum", lr=1e-3, seed=seed, stage=stage, **JOB), 0.345, 0.34)
    entries = json.loads(tuned_lrs.table_text([study], root=tmp_path))["entries"]
    assert {e["optimizer"] for e in entries} == set(CHOSEN)


def test_a_matching_job_runs_at_the_tuned_lr_and_any_other_at_the_registry_default(table):
    adamw = optimizers.resolve("adamw")
    assert lr_for(TrialSpec(optimizer="adamw", **JOB), adamw) == (3e-4, "tuned: study.jsonl")
    other = TrialSpec(optimizer="adamw", **{**JOB, "steps": 7})
    assert lr_for(other, adamw) == (adamw.default_lr, LR_DEFAULT)
    assert lr_for(TrialSpec(optimizer="adamw", lr=1e-3, **JOB), adamw) == (1e-3, "user")


@pytest.mark.parametrize(("flags", "said", "source"), [
    ([], "adamw lr 0.0003, tuned: study.jsonl", "tuned: study.jsonl"),
    (["--steps", "7"], "adamw lr 5e-05: the registry's untuned default (`optbench study` tunes it for this job)",
     LR_DEFAULT),
    (["--lr", "1e-3"], "adamw lr 0.001 (--lr)", "user"),
])
def test_run_prints_where_each_lr_came_from_and_records_it(table, tmp_path, monkeypatch, capsys, flags, said,
                                                            source):
    planned = []
    monkeypatch.setattr("optbench.sweep.run_sweep", lambda specs, out, **_: planned.extend(specs) or [])
    monkeypatch.setattr("optbench.cli.run.finish", lambda args, out: None)
    argv = ["run", "--workload", "tiny", "--device", "cpu", "--optimizers", "adamw", "--steps", "6",
            "--warmup-steps", "1", "--batch-size", "4", "--seq-len", "16", "--eval-size", "32",
            "--out", str(tmp_path / "r.jsonl"), *flags]
    assert main(argv) == 0
    assert f"optbench: {said}" in capsys.readouterr().err
    assert [spec.lr_source for spec in planned] == [source]


def test_the_committed_table_is_what_its_sources_give():
    sources = json.loads(tuned.TABLE.read_text())["sources"]
    if not sources:
        pytest.skip("the shipped table is empty until a reference study fills it (scripts/reference-results study)")
    assert tuned_lrs.main(["--check"]) == 0


def test_the_record_says_where_its_lr_came_from():
    from optbench.trial.settings import settings_record

    assert settings_record(TrialSpec(optimizer="adamw", **JOB)).lr_source == LR_DEFAULT
    assert settings_record(TrialSpec(optimizer="adamw", lr=1e-3, **JOB)).lr_source == "user"
    assert settings_record(TrialSpec(optimizer="adamw", lr=1e-3, lr_source="study: chosen", **JOB)).lr_source == \
        "study: chosen"
    assert isinstance(Record().lr_source, type(None))


def test_an_lr_nothing_resolved_is_not_called_the_users():
    """A failed trial's record whose optimizer or workload is unknown: lr 0.0 from LR_UNRESOLVED, never "user"; an
    lr the user gave is still theirs, and an optimizer that resolved keeps its state precision."""
    from optbench.trial.settings import settings_record
    from optbench.workloads import LR_UNRESOLVED

    unknown = settings_record(TrialSpec(optimizer="nosuch", **JOB))
    assert (unknown.lr, unknown.lr_source, unknown.optimizer) == (0.0, LR_UNRESOLVED, "nosuch")
    assert settings_record(TrialSpec(optimizer="nosuch", lr=1e-3, **JOB)).lr_source == "user"
    no_workload = settings_record(TrialSpec(optimizer="adamw8bit", **{**JOB, "workload": "nosuch"}))
    assert (no_workload.lr, no_workload.lr_source) == (0.0, LR_UNRESOLVED)
    assert no_workload.state_precision == optimizers.resolve("adamw8bit").precision != ""
