"""Tests never touch the network: every Hugging Face client is put offline before anything imports it. Under
pytest-xdist each worker's torch (and every trial process it starts) runs on one thread: two workers on two cores
would otherwise each spin two OpenMP threads and slow one another several times over. The user's cache (their own
peak-predictor calibration, which takes precedence over the shipped one) is an empty folder of the test session's,
so a calibration fitted on this machine changes no prediction a test checks."""

import os
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Per-machine files (the bandwidth calibration) from a folder of the test session's own, never the user's cache
# (set below): a test must not read a calibration the machine happens to have, nor write one.
os.environ.pop("OPTBENCH_BANDWIDTH_FILE", None)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

_CACHE = tempfile.TemporaryDirectory(prefix="optbench-test-cache-")  # removed when the session's process ends
os.environ["OPTBENCH_CACHE"] = _CACHE.name


# The two workers take test files in collection order, a file at a time (--dist loadfile): files collected last
# run last, and one long file at the end keeps one worker busy while the other idles. The longest files (measured:
# `python -m pytest -q tests --durations=0`, summed per file) are collected first, the rest in their usual order.
LONGEST_FIRST = ("test_parallel.py", "test_optimizers.py", "test_scaling.py", "test_trial.py", "test_workloads.py",
                 "test_engines.py", "test_faults.py", "test_resume.py", "test_runner.py", "test_cli.py",
                 "test_fit.py", "test_study.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order
