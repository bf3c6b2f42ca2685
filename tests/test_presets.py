"""The committed design (optbench/job/presets.toml): read once, every preset explained, the control on the study's
own job."""

import dataclasses
import re

from optbench.job import planner
from optbench.job.spec import PRESETS, PRESETS_FILE, STUDY_BUDGETS


def test_every_preset_and_study_table_says_why_in_a_comment():
    text = PRESETS_FILE.read_text(encoding="utf-8")
    for kind, names in (("preset", PRESETS), ("study", STUDY_BUDGETS)):
        for name in names:
            block = re.search(rf"^\[{kind}\.{name}\]\n(#.*\n)+", text, re.M)
            assert block, f"[{kind}.{name}] has no comment saying why"


def test_the_control_is_the_studys_own_job_and_design_with_its_two_arms():
    study, control = PRESETS["study"], PRESETS["control"]
    assert dataclasses.replace(control, optimizers=()) == study
    assert control.optimizers == ("adamw", "sgd_momentum")
    assert STUDY_BUDGETS["control"] == STUDY_BUDGETS["study"]
    assert planner.resolve_names(None, control) == ["adamw", "sgd_momentum"]
    assert planner.resolve_names(None, study) == ["adamw", "adafactor", "adamw8bit"]


def test_run_s_default_job_is_the_studys_job():
    """So `run` at the lr a study chose repeats its seed-0 trial (and matches the shipped table of tuned lrs)."""
    default, study = PRESETS["default"], PRESETS["study"]
    fields = ("workload", "steps", "warmup_steps", "batch_size", "seq_len", "eval_size")
    assert [getattr(default, f) for f in fields] == [getattr(study, f) for f in fields]
    assert default.seeds == (0,)
