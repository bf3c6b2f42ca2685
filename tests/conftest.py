"""Tests never touch the network: every Hugging Face client is put offline before anything imports it. Under
pytest-xdist each worker's torch (and every trial process it starts) runs on one thread: two workers on two cores
would otherwise each spin two OpenMP threads and slow one another several times over."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
