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
    # one group for the whole repository: two branches' nights on one GPU would time each other
    assert workflow["concurrency"]["group"] == "nightly-gpu" and workflow["concurrency"]["cancel-in-progress"] is False
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


def _bash_step(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """A `run:` step as GitHub runs it with `shell: bash`: bash --noprofile --norc -eo pipefail."""
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def _stub(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("accept", [False, True])
def test_the_night_is_one_optbench_nightly_command_the_cli_parses(workflow, job, tmp_path, accept):
    """The Night step run in bash with the venv's python stubbed to log its argv; the argv then goes through
    optbench's own parser: a renamed flag or a broken `--accept` expansion fails here."""
    from optbench.cli.options import build_parser

    runs = [step for step in job["steps"] if "run" in step]
    assert len(runs) == 4 and "pip install" in runs[0]["run"] and "-m cuda" in runs[1]["run"]
    night = _night_step(job)
    assert "if" not in night and "continue-on-error" not in night  # a red night fails the job
    env = {**os.environ, **workflow["env"], "ACCEPT": "--accept" if accept else ""}
    _stub(tmp_path / env["VENV"] / "bin" / "python", f'printf "%s\\n" "$@" > "{tmp_path}/argv"\n')
    result = _bash_step(night["run"], tmp_path, env)
    assert result.returncode == 0, result.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[:2] == ["-m", "optbench"]
    args = build_parser().parse_args(argv[2:])
    assert (args.command, args.device, args.preset) == ("nightly", "cuda", "nightly")
    assert (args.baseline, args.out) == (Path(env["BASELINE_DIR"]), Path(env["NIGHT_DIR"]))
    assert args.accept is accept  # only when asked for by hand (workflow_dispatch's input)


@pytest.mark.parametrize("cuda", [True, False])
def test_install_keeps_the_runners_cuda_torch_and_stops_without_one(workflow, job, tmp_path, cuda):
    """The Install step run in bash against stubs: `python3 -m venv` makes a venv whose python sees a fake torch
    (CUDA or not) and logs what pip was asked. With CUDA, pip installs constrained to the torch that is there;
    without, the step fails before pip could swap the runner's torch for another build."""
    install = next(step["run"] for step in job["steps"] if "pip install" in step.get("run", ""))
    (tmp_path / "fake" / "torch").mkdir(parents=True)
    (tmp_path / "fake" / "torch" / "__init__.py").write_text(
        f"__version__ = '2.5.1+cu124'\n\nclass cuda:\n    is_available = staticmethod(lambda: {cuda})\n")
    venv_python = _stub(tmp_path / "stubs" / "venv-python",
                        f'[ "$1" = -c ] && PYTHONPATH="{tmp_path}/fake" exec "{sys.executable}" -c "$2"\n'
                        f'echo "$@" > "{tmp_path}/pip"\n')
    _stub(tmp_path / "bin" / "python3", f'echo "$@" > "{tmp_path}/venv"\nfor last; do :; done\n'
                                        f'mkdir -p "$last/bin" && cp "{venv_python}" "$last/bin/python"\n')
    runner_temp = tmp_path / "runner-temp"
    runner_temp.mkdir()
    env = {**os.environ, **workflow["env"], "RUNNER_TEMP": str(runner_temp),
           "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    result = _bash_step(install, tmp_path, env)
    assert (tmp_path / "venv").read_text().split() == ["-m", "venv", "--system-site-packages", env["VENV"]]
    if not cuda:
        assert result.returncode != 0 and not (tmp_path / "pip").exists()
        return
    assert result.returncode == 0, result.stderr
    constraint = runner_temp / "torch-constraint.txt"
    assert constraint.read_text().strip() == "torch==2.5.1+cu124"
    assert (tmp_path / "pip").read_text().split() == ["-m", "pip", "install", "--constraint", str(constraint), "-e",
                                                      ".[dev,all]"]  # the optional optimizers on the GPU too


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
    night = _night_step(job)
    preflight = next(step for step in steps if step.get("id") == "preflight")
    assert steps.index(preflight) < steps.index(restore) < steps.index(night) < steps.index(save)
    assert "${{ steps.preflight.outputs.key }}" in restore["with"]["restore-keys"]  # GPU, driver and torch
    assert save["if"] == "success()"
    assert restore["with"]["path"] == save["with"]["path"] == "${{ env.BASELINE_DIR }}"
    assert save["with"]["key"] == restore["with"]["key"]  # a fresh key per run; restore-keys finds the latest
    assert save["with"]["key"].startswith(restore["with"]["restore-keys"])


def _night_step(job) -> dict:
    return next(step for step in job["steps"] if "--preset nightly" in step.get("run", ""))


def test_the_preflight_writes_the_baseline_key_the_cli_prints(workflow, job, tmp_path):
    """The pre-flight step run in bash with the venv's python stubbed: its argv is optbench's own
    `nightly --print-baseline-key`, and what it prints becomes the step's `key` output."""
    from optbench.cli.options import build_parser

    step = next(step for step in job["steps"] if step.get("id") == "preflight")
    env = {**os.environ, **workflow["env"], "GITHUB_OUTPUT": str(tmp_path / "output")}
    _stub(tmp_path / env["VENV"] / "bin" / "python",
          f'printf "%s\\n" "$@" > "{tmp_path}/argv"\necho nvidia-h200_driver-580.159.04_torch-2.11.0\n')
    result = _bash_step(step["run"], tmp_path, env)
    assert result.returncode == 0, result.stderr
    args = build_parser().parse_args((tmp_path / "argv").read_text().splitlines()[2:])
    assert (args.command, args.device, args.print_baseline_key) == ("nightly", "cuda", True)
    assert (tmp_path / "output").read_text() == "key=nvidia-h200_driver-580.159.04_torch-2.11.0\n"


def test_the_night_is_uploaded_even_when_red(job):
    upload = _step(job, "actions/upload-artifact@")
    assert upload["if"] == "always()" and upload["with"]["path"].startswith("${{ env.NIGHT_DIR }}")
