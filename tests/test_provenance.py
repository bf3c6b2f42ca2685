"""Provenance: the stamp says whether the checkout was dirty, and the reference steps refuse to measure from one."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optbench.records.environment import git_dirty

ROOT = Path(__file__).resolve().parents[1]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "old.jsonl").write_text("{}\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "start")
    return tmp_path


def test_a_clean_checkout_is_not_dirty_and_results_written_into_it_keep_it_clean(repo):
    assert git_dirty(repo) is False
    (repo / "results" / "new.jsonl").write_text("{}\n")  # an earlier reference step's records
    (repo / "results" / "old.jsonl").write_text("{}\n{}\n")
    assert git_dirty(repo) is False


def test_the_stamp_never_writes_the_index(repo):
    """`git status` refreshes a stale index and takes .git/index.lock to write it; a stamp's git killed at its
    timeout, or with its trial, left the lock behind and the user's commits failed. The stamp reads only."""
    index = repo / ".git" / "index"
    stat = (repo / "code.py").stat()
    os.utime(repo / "code.py", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # same bytes, stale stat info
    before = (index.read_bytes(), index.stat().st_mtime_ns)
    assert git_dirty(repo) is False
    assert (index.read_bytes(), index.stat().st_mtime_ns) == before


@pytest.mark.parametrize("change", ["edit", "untracked"])
def test_a_changed_or_added_source_file_makes_it_dirty(repo, change):
    (repo / ("code.py" if change == "edit" else "new.py")).write_text("x = 2\n")
    assert git_dirty(repo) is True


def test_outside_a_checkout_dirtiness_is_unknown(tmp_path):
    assert git_dirty(tmp_path) is None


def test_every_stamp_carries_the_flag():
    from optbench.records.environment import environment

    assert "git_dirty" in environment()


def _reference_results(repo: Path, *steps: str) -> subprocess.CompletedProcess:
    (repo / "scripts").mkdir(exist_ok=True)
    shutil.copy(ROOT / "scripts" / "reference-results", repo / "scripts" / "reference-results")
    _git(repo, "add", "scripts")
    _git(repo, "commit", "-qm", "script")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "scripts/reference-results", *steps], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=120)


def test_reference_steps_refuse_to_measure_from_a_dirty_tree(repo):
    (repo / "code.py").write_text("x = 3\n")
    result = _reference_results(repo, "default")  # fails before anything runs
    assert result.returncode == 2 and "uncommitted changes" in result.stderr, result.stderr


def test_reference_steps_from_a_clean_tree_get_past_the_check(repo):
    result = _reference_results(repo, "no-such-step")
    assert result.returncode == 2 and "unknown step 'no-such-step'" in result.stderr, result.stderr
