"""scripts/reference-results' `threads_set`, the one-thread roofline sets' recipe, with `python` replaced by a stub
that logs each command, its thread variables, and writes the file it names: the two routes to a thread count (the
environment, the first sets'; the flags, as a user types them) and a refused calibration kept as attempt N."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STUB = r"""
set -euo pipefail
python() {
  echo "OMP=${OMP_NUM_THREADS:-} OTT=${OPTBENCH_TORCH_THREADS:-} python $*" >> "$LOG"
  local prev="" target="" a
  for a in "$@"; do [ "$prev" = "--out" ] && target=$a; prev=$a; done
  [ -n "$target" ] || target=${!#}
  if [ "$target" = "${REFUSE:-}" ]; then echo "128 MiB: ceiling 47.0 GB/s; unsteady"; return 1; fi
  touch "$target"
}
timed() { "$@"; }
"""


def _threads_set(tmp_path: Path, *args: str, refuse: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    script = (ROOT / "scripts" / "reference-results").read_text()
    function = re.search(r"^threads_set\(\) \(\n.*?^\)\n", script, flags=re.MULTILINE | re.DOTALL)
    assert function, "threads_set not found in scripts/reference-results"
    log = tmp_path / "log"
    log.unlink(missing_ok=True)
    program = f"{STUB}\n{function.group(0)}\nthreads_set {' '.join(args)}\n"
    env = {"PATH": "/usr/bin:/bin", "LOG": str(log), "REFUSE": refuse}
    result = subprocess.run(["bash", "-c", program], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=60)
    lines = log.read_text().replace(str(tmp_path), ".").splitlines() if log.is_file() else []
    return result, lines


def test_the_environment_route_gives_every_process_the_count(tmp_path):
    result, lines = _threads_set(tmp_path, str(tmp_path / "set"), "1", "env")
    assert result.returncode == 0, result.stderr
    assert len(lines) == 5 and all(line.startswith("OMP=1 OTT=1 ") for line in lines)
    run = next(line for line in lines if " run " in line)
    assert "--threads" not in run and "--paired-probe" in run and "--seeds 0,1,2,3,4" in run
    assert sorted(p.name for p in (tmp_path / "set").iterdir()) == [
        "after.json", "before.json", "post-check.json", "pre-check.json", "roofline.jsonl"]


def test_the_flags_route_types_the_count_and_only_the_probe_reads_the_environment(tmp_path):
    result, lines = _threads_set(tmp_path, str(tmp_path / "set"), "1", "flags")
    assert result.returncode == 0, result.stderr
    probes = [line for line in lines if "steadiness_probe" in line]
    optbench = [line for line in lines if "-m optbench" in line]
    assert len(probes) == 2 and all(line.startswith("OMP=1 OTT= ") for line in probes)
    assert len(optbench) == 3 and all(line.startswith("OMP= OTT= ") and "--threads 1" in line for line in optbench)


def test_a_refused_calibration_is_kept_as_the_next_attempt_and_no_trial_runs(tmp_path):
    folder = tmp_path / "set"
    for attempt in (1, 2):
        result, lines = _threads_set(tmp_path, str(folder), "1", "flags", refuse=str(folder / "before.json"))
        assert result.returncode == 2 and f"attempt {attempt} kept" in result.stderr, result.stderr
        assert not any(" run " in line for line in lines)
    assert sorted(p.name for p in folder.iterdir()) == [
        "refused-1-before.txt", "refused-1-pre-check.json", "refused-2-before.txt", "refused-2-pre-check.json"]
    assert "unsteady" in (folder / "refused-2-before.txt").read_text()


def test_a_route_it_does_not_know_is_refused(tmp_path):
    result, lines = _threads_set(tmp_path, str(tmp_path / "set"), "1", "bogus")
    assert result.returncode == 2 and "route is env or flags" in result.stderr and not lines
