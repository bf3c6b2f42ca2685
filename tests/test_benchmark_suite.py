"""The benchmark suite collects one benchmark per registry entry and kind, and refuses an unknown preset.
(Running it is `pytest benchmarks/ --benchmark-only`; it measures, so it is not part of the tests.)"""

import os
import re
import subprocess
import sys
from pathlib import Path

from optbench.optimizers import REGISTRY, representatives

ROOT = Path(__file__).resolve().parents[1]


def _collect(*args, **env):
    return subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "--collect-only", "-q", "-p",
                           "no:cacheprovider", *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def _benchmarked(stdout: str) -> list[str]:
    """The optimizers collected, checking that each of the three kinds has the same ones."""
    kinds = ("test_optimizer_step", "test_train_step", "test_finetune")
    per_kind = [sorted(set(re.findall(rf"{kind}\[(\w+)\]", stdout))) for kind in kinds]
    assert per_kind[0] == per_kind[1] == per_kind[2]
    return per_kind[0]


def test_the_default_benchmarks_one_entry_per_family_and_all_benchmarks_every_entry():
    default = _collect(OPTBENCH_PRESET="smoke")
    assert default.returncode == 0, default.stdout + default.stderr
    assert _benchmarked(default.stdout) == sorted(representatives())
    assert {"adamw", "adafactor", "adamw8bit"} <= set(representatives()) < set(REGISTRY)
    assert "test_harness_step_time_matches_a_bare_loop" in default.stdout
    every = _collect("--optbench-optimizers", "all", OPTBENCH_PRESET="smoke")
    assert _benchmarked(every.stdout) == sorted(REGISTRY)
    chosen = _collect("--optbench-optimizers", "adamw_bnb_8bit,sgd", OPTBENCH_PRESET="smoke")
    assert _benchmarked(chosen.stdout) == ["adamw8bit_hf", "sgd"]


def test_an_unknown_preset_is_refused_at_start_up():
    result = _collect(OPTBENCH_PRESET="huge")
    assert result.returncode != 0
    assert "OPTBENCH_PRESET='huge' is not a preset" in result.stdout + result.stderr
