"""The CUDA path's device logic, run here with torch.cuda faked: which GPU a trial, a rank, the memory cap, the
environment stamp and the benchmark suite use. (The process layer's GPU masks: tests/test_devices.py. What needs
a real GPU: tests/test_cuda.py.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from optbench.job.devices import GPU_PINNED_ENV, resolve_device
from optbench.records.environment import environment, gpu_name
from optbench.sweep.child import cap_memory

ROOT = Path(__file__).resolve().parents[1]


class FakeCuda:
    """`count` GPUs of 80 GiB, GPU `current` current; keeps what was set, and refuses what torch 2.13 refuses."""

    TOTAL_BYTES = 80 * 2**30

    def __init__(self, monkeypatch, count: int = 2, current: int = 0) -> None:
        self.count, self.current, self.names_asked = count, current, []
        self.allowed_bytes = dict.fromkeys(range(count), self.TOTAL_BYTES)  # each GPU's caching-allocator limit
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "set_device", self._set_device)
        monkeypatch.setattr(torch.cuda, "get_device_name", self._name)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: _Properties(self.TOTAL_BYTES))
        monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", self._set_fraction)

    def _set_fraction(self, fraction, device=None) -> None:
        """torch/cuda/memory.py: a float in [0, 1] for an existing GPU (None: the current one), else an error."""
        index = self.current if device is None else device if isinstance(device, int) else device.index
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if not 0 <= fraction <= 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        if index not in self.allowed_bytes:
            raise RuntimeError(f"Invalid device argument {index}")
        self.allowed_bytes[index] = int(fraction * self.TOTAL_BYTES)

    def _set_device(self, device) -> None:
        index = device if isinstance(device, int) else device.index
        if index is None:  # what torch 2.13 does (torch/cuda/_utils._get_device_index, optional=False)
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        self.current = index

    def _name(self, index) -> str:
        self.names_asked.append(index)
        return f"GPU {index}"


class _Properties:
    def __init__(self, total_memory: int) -> None:
        self.total_memory = total_memory


def test_a_pinned_trial_sees_its_gpu_as_cuda_0_and_a_bad_index_is_refused(monkeypatch):
    FakeCuda(monkeypatch, count=1)
    monkeypatch.setenv(GPU_PINNED_ENV, "1")
    assert resolve_device("cuda:3") == torch.device("cuda", 0)  # CUDA_VISIBLE_DEVICES holds GPU 3 only
    monkeypatch.delenv(GPU_PINNED_ENV)
    with pytest.raises(ValueError, match="only 1 GPU"):
        resolve_device("cuda:3")


@pytest.mark.parametrize("name", ["auto", "cuda"])
def test_auto_and_cuda_resolve_to_the_current_gpu_with_its_index(monkeypatch, name):
    cuda = FakeCuda(monkeypatch, count=2, current=1)
    device = resolve_device(name)
    assert device == torch.device("cuda", 1)
    torch.cuda.set_device(device)  # trial.setup's next call; raises for an unindexed device
    assert cuda.current == 1


def test_each_rank_of_a_pinned_torchrun_group_keeps_the_gpu_it_set(monkeypatch):
    cuda = FakeCuda(monkeypatch, count=2)
    monkeypatch.setenv(GPU_PINNED_ENV, "1")  # the group's two GPUs are the process's cuda:0 and cuda:1
    torch.cuda.set_device(1)  # process.child.rank_main for LOCAL_RANK=1
    assert resolve_device("cuda") == torch.device("cuda", 1) and cuda.current == 1  # asked, not switched


def test_the_memory_cap_limits_the_trials_gpu_and_only_it(monkeypatch):
    cuda = FakeCuda(monkeypatch, count=2, current=1)
    cap_memory(torch.device("cuda"), 20 * 2**30)  # no index: the current GPU, which a rank set before the cap
    assert cuda.allowed_bytes == {0: 80 * 2**30, 1: 20 * 2**30}
    cap_memory(torch.device("cuda", 0), 40 * 2**30)
    assert cuda.allowed_bytes == {0: 40 * 2**30, 1: 20 * 2**30}
    cap_memory(torch.device("cuda", 1), 200 * 2**30)  # more than the GPU has: the whole GPU, not torch's ValueError
    assert cuda.allowed_bytes[1] == 80 * 2**30


def test_a_cpu_trials_environment_stamp_never_asks_cuda(monkeypatch):
    def forbidden(*args):
        raise AssertionError("CUDA asked from a CPU trial: a forked child would fail to initialise it")

    for name in ("is_available", "get_device_name", "current_device", "device_count"):
        monkeypatch.setattr(torch.cuda, name, forbidden)
    assert environment(torch.device("cpu"))["gpu"] is None


def test_the_environment_stamp_names_the_gpu_the_trial_used(monkeypatch):
    cuda = FakeCuda(monkeypatch, count=2, current=0)
    assert environment(torch.device("cuda", 1))["gpu"] == "GPU 1"
    assert gpu_name(None) == "GPU 0"  # no device given: the current one
    assert cuda.names_asked == [1, 0]


def _bench_support():
    spec = importlib.util.spec_from_file_location("bench_support", ROOT / "benchmarks" / "bench_support.py")
    module = sys.modules.setdefault("bench_support", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_suite_runs_on_the_gpu_it_was_given_and_makes_it_current(monkeypatch):
    suite_device = _bench_support().suite_device
    cuda = FakeCuda(monkeypatch, count=2, current=0)
    assert suite_device("cuda:1") == torch.device("cuda", 1) and cuda.current == 1  # events on GPU 1's stream
    assert suite_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="only 2 GPU"):
        suite_device("cuda:2")


def test_the_benchmark_suite_on_this_machine_resolves_auto_to_an_indexed_device():
    device = _bench_support().suite_device("auto")
    assert device == (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
                      else torch.device("cpu"))
