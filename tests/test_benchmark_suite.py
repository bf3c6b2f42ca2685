"""The benchmark suite collects one benchmark per registry entry and kind, and refuses an unknown preset.
(Running it is `pytest benchmarks/ --benchmark-only`; it measures, so it is not part of the tests.)"""

import os
import subprocess
import sys
from pathlib import Path

from optbench.optimizers import REGISTRY

ROOT = Path(__file__).resolve().parents[1]


def _collect(**env):
    return subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "--collect-only", "-q", "-p",
                           "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_every_optimizer_of_the_registry_is_benchmarked():
    result = _collect(OPTBENCH_PRESET="smoke")
    assert result.returncode == 0, result.stdout + result.stderr
    for kind in ("test_optimizer_step", "test_train_step", "test_finetune"):
        for name in REGISTRY:
            assert f"{kind}[{name}]" in result.stdout
    assert "test_harness_step_time_matches_a_bare_loop" in result.stdout


def test_an_unknown_preset_is_refused_at_start_up():
    result = _collect(OPTBENCH_PRESET="huge")
    assert result.returncode != 0
    assert "OPTBENCH_PRESET='huge' is not a preset" in result.stdout + result.stderr
