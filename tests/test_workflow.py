"""The nightly GPU workflow: thin around `optbench nightly`, pinned, installed without touching the runner's CUDA
torch, and wired so a red night fails and keeps the baseline. actionlint and zizmor lint it (here and in .ci/run);
the other tests pin down what the lints cannot know."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "nightly-gpu.yml"
ACTIONLINT_CONFIG = ROOT / ".github" / "actionlint.yaml"
BUILT_IN_LABELS = {"self-hosted", "linux", "x64"}


@pytest.fixture(scope="module")
def workflow():
    return yaml.safe_load(WORKFLOW.read_text())


@pytest.fixture(scope="module")
def job(workflow):
    (job,) = workflow["jobs"].values()
    return job


def _step(job, uses_prefix):
    return next(step for step in job["steps"] if step.get("uses", "").startswith(uses_prefix))


def test_triggers_and_one_night_at_a_time(workflow):
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert triggers["schedule"][0]["cron"].count(" ") == 4
    assert "workflow_dispatch" in triggers
    assert workflow["concurrency"]["group"] and workflow["concurrency"]["cancel-in-progress"] is False
    assert workflow["permissions"] == {"contents": "read"}


def test_runner_labels_are_declared_for_actionlint(job):
    declared = set(yaml.safe_load(ACTIONLINT_CONFIG.read_text())["self-hosted-runner"]["labels"])
    assert "gpu" in job["runs-on"] and set(job["runs-on"]) <= BUILT_IN_LABELS | declared


def test_every_action_is_pinned_to_a_commit_with_its_release_named():
    uses = re.findall(r"uses:\s*(\S+)(.*)", WORKFLOW.read_text())
    assert len(uses) >= 4
    for action, comment in uses:
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", action), action
        assert re.search(r"#\s*v\d+\.\d+\.\d+", comment), f"{action}: name the release in a comment"


def test_checkout_keeps_no_credentials(job):
    assert _step(job, "actions/checkout")["with"]["persist-credentials"] is False


def test_the_night_is_one_command(job):
    runs = [step["run"] for step in job["steps"] if "run" in step]
    assert len(runs) == 2 and "pip install" in runs[0]
    night = runs[1]
    assert night.startswith('"$VENV/bin/python" -m optbench nightly')  # the install step's environment
    assert "--device cuda" in night and "--preset nightly" in night
    assert '--baseline "$BASELINE_DIR"' in night
    assert "--accept" not in night.replace('"$ACCEPT"', "")  # only when asked for by hand (workflow_dispatch)
    (night_step,) = [step for step in job["steps"] if step.get("run") == night]
    assert "if" not in night_step and "continue-on-error" not in night_step  # a red night fails the job


def test_install_goes_into_a_venv_that_keeps_the_runners_cuda_torch(workflow, job):
    """A Debian/Ubuntu system Python refuses pip installs (PEP 668), and an unconstrained `pip install` may swap
    the runner's CUDA torch for another build: a venv over the system site-packages, pip pinned to the torch
    that is there."""
    install = next(step["run"] for step in job["steps"] if "pip install" in step.get("run", ""))
    lines = install.splitlines()
    assert lines[0] == 'python3 -m venv --system-site-packages "$VENV"' and workflow["env"]["VENV"]
    assert "torch.cuda.is_available()" in install and "f'torch=={torch.__version__}'" in install
    (pip,) = [line for line in lines if "pip install" in line]
    assert pip.startswith('"$VENV/bin/python" -m pip install --constraint ') and "torch-constraint.txt" in pip


def _tool(name: str) -> str:
    path = Path(sys.executable).parent / name  # the dev extra installs both next to this Python
    if not path.exists():
        pytest.skip(f"{name} is not installed next to {sys.executable} (pip install -e '.[dev]')")
    return str(path)


@pytest.mark.parametrize("argv", [["actionlint"], ["zizmor", "--offline", ".github/workflows"]])
def test_the_workflow_lints_clean(argv):
    """actionlint: syntax, expressions, runner labels (.github/actionlint.yaml); zizmor: pinning, credentials,
    template injection. Any finding fails."""
    result = subprocess.run([_tool(argv[0]), *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "NO_COLOR": "1"})
    assert result.returncode == 0, result.stdout + result.stderr


def test_baseline_restored_before_and_saved_only_after_a_clean_night(job, workflow):
    steps = job["steps"]
    restore, save = _step(job, "actions/cache/restore@"), _step(job, "actions/cache/save@")
    night = next(step for step in steps if "optbench nightly" in step.get("run", ""))
    assert steps.index(restore) < steps.index(night) < steps.index(save)
    assert save["if"] == "success()"
    assert restore["with"]["path"] == save["with"]["path"] == "${{ env.BASELINE_DIR }}"
    assert save["with"]["key"] == restore["with"]["key"]  # a fresh key per run; restore-keys finds the latest
    assert save["with"]["key"].startswith(restore["with"]["restore-keys"])


def test_the_night_is_uploaded_even_when_red(job):
    upload = _step(job, "actions/upload-artifact@")
    assert upload["if"] == "always()" and upload["with"]["path"].startswith("${{ env.NIGHT_DIR }}")
