"""Probes: each storage counted once, wrapper subclasses through their inner tensors, peaks, stats."""

import pytest
import torch
from torch.utils._pytree import tree_map

from optbench import measure


class Quantized(torch.Tensor):
    """A minimal wrapper subclass in the style of torchao's quantised optimizer states: it pretends to
    be a float32 tensor of `shape` but holds uint8 codes plus one fp32 scale per 64-element block."""

    @staticmethod
    def __new__(cls, codes, scale, shape):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.float32)

    def __init__(self, codes, scale, shape):
        self.codes, self.scale = codes, scale

    def __tensor_flatten__(self):
        return ["codes", "scale"], [self.shape]

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda t: t.codes.float() if isinstance(t, Quantized) else t  # noqa: E731
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))


class _FakeOptimizer:
    def __init__(self, state):
        self.state = state


def test_subclass_is_counted_through_its_inner_tensors():
    q = Quantized(torch.zeros(4096, dtype=torch.uint8), torch.zeros(64), (4096,))
    assert q.element_size() * q.numel() == 4 * 4096  # what a naive count would charge
    total, by_key = measure.optimizer_state_bytes(_FakeOptimizer({0: {"exp_avg": q}}))
    assert total == 4096 + 64 * 4
    assert by_key == {"exp_avg": 4096 + 256}


def test_shared_and_viewed_storages_count_once():
    shared = torch.zeros(256)
    big = torch.zeros(1000)
    state = {0: {"qmap": shared, "m": big}, 1: {"qmap": shared, "m": big[:10]}, 2: {"step": 3}}
    total, by_key = measure.optimizer_state_bytes(_FakeOptimizer(state))
    assert total == 256 * 4 + 1000 * 4
    assert by_key == {"m": 4000, "qmap": 1024}
    assert measure.unique_tensor_bytes([big, big[5:], shared]) == 5024


def test_median_and_iqr():
    assert measure.median_iqr([]) == (None, None)
    assert measure.median_iqr([2.0]) == (2.0, 0.0)
    median, iqr = measure.median_iqr([1.0, 2.0, 3.0, 4.0, 100.0])
    assert median == 3.0 and iqr == pytest.approx(2.0)


@pytest.mark.skipif(measure.peak_rss_bytes() is None, reason="no /proc/self/status on this system")
def test_peak_rss_sees_a_tensor_and_resets():
    if not measure.reset_peak_rss():
        pytest.skip("this kernel does not allow resetting VmHWM via /proc/self/clear_refs")
    before = measure.peak_rss_bytes()
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    grown = measure.peak_rss_bytes()
    assert grown - before >= 60 * 2**20
    del block
    measure.reset_peak_rss()
    assert measure.peak_rss_bytes() < grown - 30 * 2**20


def test_cuda_peaks_are_none_off_cuda():
    assert measure.cuda_peaks(torch.device("cpu")) == (None, None)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_peak_allocated_sees_a_tensor():
    device = torch.device("cuda")
    measure.reset_peaks(device)
    block = torch.ones(2**20, device=device)
    allocated, reserved = measure.cuda_peaks(device)
    assert allocated >= 4 * 2**20 and reserved >= allocated
    del block


def test_step_timer_on_cpu_reads_intervals_between_marks():
    timer = measure.StepTimer(torch.device("cpu"))
    timer.mark("a")
    sum(range(100_000))
    timer.mark("b")
    timer.mark("c")
    assert timer.seconds("a", "b") > 0 and timer.seconds("a", "c") >= timer.seconds("a", "b")


def test_copy_bandwidth_is_a_positive_rate():
    assert measure.copy_bandwidth_bytes_per_s(torch.device("cpu"), nbytes=8 * 2**20, repeats=2) > 1e8


def test_slowdown_knob_is_off_unless_set_and_slows_step_when_set(monkeypatch):
    param = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([param], lr=0.1)
    original = optimizer.step
    monkeypatch.delenv(measure.SLOWDOWN_ENV, raising=False)
    measure.slow_down_if_asked(optimizer)
    assert optimizer.step == original  # untouched: no cost in real runs
    monkeypatch.setenv(measure.SLOWDOWN_ENV, "1.0")
    slept = []
    monkeypatch.setattr(measure.time, "sleep", slept.append)
    measure.slow_down_if_asked(optimizer)
    param.grad = torch.ones(4)
    optimizer.step()
    assert len(slept) == 1 and slept[0] > 0 and torch.allclose(param.detach(), torch.full((4,), 0.9))
