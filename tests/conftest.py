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
