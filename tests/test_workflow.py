"""The nightly GPU workflow has the parts its job depends on (parsed with pyyaml; actionlint is not installable
from PyPI here: its wheel build downloads the binary from GitHub)."""

from pathlib import Path

import pytest
import yaml

WORKFLOW = Path(__file__).resolve().parents[1] / ".github" / "workflows" / "nightly-gpu.yml"


@pytest.fixture(scope="module")
def workflow():
    return yaml.safe_load(WORKFLOW.read_text())


@pytest.fixture(scope="module")
def steps(workflow):
    (job,) = workflow["jobs"].values()
    return job["steps"]


def _step_running(steps, *fragments):
    """The first step whose `run` script holds every fragment (fails the test if none does)."""
    for step in steps:
        if all(fragment in step.get("run", "") for fragment in fragments):
            return step
    pytest.fail(f"no step runs {fragments}")


def test_triggers_runner_and_concurrency(workflow):
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert triggers["schedule"][0]["cron"].count(" ") == 4
    assert "workflow_dispatch" in triggers
    (job,) = workflow["jobs"].values()
    assert job["runs-on"] == ["self-hosted", "linux", "x64", "gpu"]
    assert workflow["concurrency"]["group"]


def test_environment_is_printed_and_the_project_installed(steps):
    _step_running(steps, "nvidia-smi")
    _step_running(steps, "python -m torch.utils.collect_env")
    _step_running(steps, 'pip install -e ".[dev]"')


def test_benchmarks_sweep_report_and_compare(steps):
    _step_running(steps, "pytest benchmarks/", "--benchmark-only", "--benchmark-autosave", "--optbench-preset nightly")
    _step_running(steps, "python -m optbench run", "--preset nightly", "--device cuda",
                  "--out results/nightly.jsonl")
    _step_running(steps, "python -m optbench report")
    compare = _step_running(steps, "python -m optbench compare", "results/nightly.jsonl")
    assert "if" not in compare  # a regression must fail the run, never be skipped past


def test_previous_results_restored_and_artifacts_always_uploaded(steps):
    uses = [step.get("uses", "") for step in steps]
    assert any(u.startswith(("actions/cache", "actions/download-artifact")) for u in uses)
    upload = next(step for step in steps if step.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()"
    assert "results/" in upload["with"]["path"]
