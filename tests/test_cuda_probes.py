"""The CUDA probes' logic, run here with torch.cuda's allocator counters faked: a pause hands an evaluation's cached
blocks back before the peaks restart, the bandwidth probe's clock warm-up, the allocator's room under a memory cap,
and bitsandbytes' host-synchronised step named beside its roofline. (On a real GPU: tests/test_cuda.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from optbench.probes import HOST_SYNCED, measure, stream
from optbench.records.record import MIB, Record
from optbench.report.render import notes

CUDA0 = torch.device("cuda", 0)


class FakeAllocator:
    """torch's caching allocator as its counters show it: freed blocks stay reserved until empty_cache()."""

    def __init__(self, monkeypatch, total_bytes: int = 80 * 2**30) -> None:
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0
        self.total_bytes = total_bytes
        for name, fake in (("synchronize", lambda device=None: None), ("empty_cache", self.empty_cache),
                           ("reset_peak_memory_stats", self.reset_peaks),
                           ("max_memory_allocated", lambda device=None: self.peak_allocated),
                           ("max_memory_reserved", lambda device=None: self.peak_reserved),
                           ("memory_reserved", lambda device=None: self.reserved),
                           ("mem_get_info", lambda device=None: (self.total_bytes - self.reserved, self.total_bytes))):
            monkeypatch.setattr(torch.cuda, name, fake)  # raising=True: each must exist in the torch under test

    def take(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.reserved = max(self.reserved, self.allocated)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def give_back(self, nbytes: int) -> None:
        self.allocated -= nbytes  # the block stays cached: reserved does not move

    def empty_cache(self) -> None:
        self.reserved = self.allocated

    def reset_peaks(self, device=None) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved


def test_an_evaluations_cached_blocks_do_not_become_the_reserved_peak(monkeypatch):
    allocator = FakeAllocator(monkeypatch)
    allocator.take(100 * MIB)  # weights, grads, state
    window = measure.MemoryWindow(CUDA0)
    with window.paused():
        allocator.take(512 * MIB)  # an LM evaluation's logits, freed but cached
        allocator.give_back(512 * MIB)
    allocator.take(20 * MIB)  # the next training step
    record = Record()
    window.fill(record)
    assert record.peak_cuda_allocated_bytes == 120 * MIB
    assert record.peak_cuda_reserved_bytes == 120 * MIB  # not 612 MiB: the pause gave its cache back
    assert record.peak_device_used_growth_bytes == 20 * MIB


def test_the_warm_up_keeps_the_gpu_busy_long_enough_for_its_clock_to_rise():
    # a pass of ~0.37 ms at full clock (a triad over 512 MiB on an H200): hundreds of passes make a quarter second
    assert stream.warm_up_pass_count(0.37e-3) == 676
    assert stream.warm_up_pass_count(0.37e-3, warm_up_s=0.5) == 1352
    assert stream.warm_up_pass_count(2.0) == 1  # a pass longer than the warm-up: one is enough
    assert stream.warm_up_pass_count(1e-9) == stream.MOST_WARM_UP_PASSES  # bounded
    assert stream.warm_up_pass_count(0.0) == stream.MOST_WARM_UP_PASSES


def test_the_warm_up_does_nothing_on_cpu():
    calls = []
    assert stream.warm_up_clocks(torch.device("cpu"), lambda: calls.append(1)) == 0 and calls == []


def test_the_allocators_room_under_a_cap(monkeypatch):
    assert stream.room_bytes(free_bytes=50, total_bytes=100, fraction=1.0, reserved_bytes=30) == 50
    assert stream.room_bytes(free_bytes=50, total_bytes=100, fraction=0.25, reserved_bytes=5) == 20
    assert stream.room_bytes(free_bytes=50, total_bytes=100, fraction=0.25, reserved_bytes=40) == 0
    allocator = FakeAllocator(monkeypatch, total_bytes=1000)
    allocator.take(100)
    # the cap's reader must exist at the torch floor: monkeypatch refuses to fake a function torch lacks
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: 0.5)
    assert stream.cuda_room_bytes(CUDA0) == 400


class _Optimizer8bit:
    """Stands in for bitsandbytes' optimizer base class (no import: bitsandbytes takes seconds to load)."""

    __module__ = "bitsandbytes.optim.optimizer"

    def __init__(self, device: torch.device) -> None:
        self.param_groups = [{"params": [SimpleNamespace(device=device)]}]


class _GaLoreAdamW8bit(_Optimizer8bit):
    __module__ = "galore_torch.adamw8bit"


def test_bitsandbytes_steps_are_named_host_synced_on_cuda():
    assert measure.optimizer_impl(_Optimizer8bit(torch.device("cpu"))) == "per-parameter"
    assert measure.optimizer_impl(_Optimizer8bit(CUDA0)) == HOST_SYNCED
    assert measure.optimizer_impl(_GaLoreAdamW8bit(CUDA0)) == HOST_SYNCED  # a subclass in another library


@pytest.mark.parametrize("impl", [HOST_SYNCED, "fused"])
def test_the_report_says_why_a_host_synced_roofline_reads_low(impl):
    rows = pd.DataFrame({"target_metric": ["accuracy"], "target_mode": ["max"], "impl": [impl], "tune_steps": [None],
                         "schedule": [None]})
    said = notes(rows)
    assert ("host-serialised" in said) == (impl == HOST_SYNCED)
