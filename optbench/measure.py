"""Probes: optimizer-state bytes, peak memory and synchronized timing.

Each probe exists because the obvious way to measure gets it wrong:
- optimizer state is created lazily on the first step() and bitsandbytes shares its quantisation maps
  across parameters, so state is counted after training, one storage at a time;
- tensor subclasses (torchao's quantised states) report the element size of the dtype they pretend
  to be, so they are counted through their inner tensors (`__tensor_flatten__`);
- CUDA kernels run asynchronously: a step is timed with CUDA events and synchronized once, at its end
  (a synchronize between backward and step() would serialize what a real loop overlaps);
- tracemalloc does not see tensor memory, so CPU peaks come from the kernel's VmHWM, which can be
  reset by writing 5 to /proc/self/clear_refs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import statistics
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _leaf_tensors(value: Any) -> Iterator[torch.Tensor]:
    """Plain tensors holding the bytes of `value`, looking through wrapper subclasses."""
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor and hasattr(value, "__tensor_flatten__"):
            inner_names, _ = value.__tensor_flatten__()
            for inner in inner_names:
                yield from _leaf_tensors(getattr(value, inner))
        else:
            yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _leaf_tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaf_tensors(item)


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def unique_tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (a view or a shared tensor counts once)."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        for leaf in _leaf_tensors(t):
            key = _storage_key(leaf)
            seen[key] = max(seen.get(key, 0), leaf.untyped_storage().nbytes())
    return sum(seen.values())


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> tuple[int, dict[str, int]]:
    """Total bytes of the optimizer's state and the split per state key, each storage counted once.

    A storage shared between keys or parameters is charged to the first key that shows it.
    """
    seen: set[tuple[str, int]] = set()
    by_key: dict[str, int] = {}
    for param_state in optimizer.state.values():
        for key, value in param_state.items():
            for leaf in _leaf_tensors(value):
                storage_key = _storage_key(leaf)
                if storage_key in seen:
                    continue
                seen.add(storage_key)
                by_key[key] = by_key.get(key, 0) + leaf.untyped_storage().nbytes()
    return sum(by_key.values()), dict(sorted(by_key.items()))


def _read_status_kib(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def current_rss_bytes() -> int | None:
    kib = _read_status_kib("VmRSS")
    return None if kib is None else kib * 1024


def peak_rss_bytes() -> int | None:
    """The process's resident-set high-water mark (VmHWM), None where /proc is absent."""
    kib = _read_status_kib("VmHWM")
    return None if kib is None else kib * 1024


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS; False when the kernel does not allow it."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def reset_peaks(device: torch.device) -> None:
    reset_peak_rss()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def release_freed_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc keeps them mapped unless asked),
    so memory an earlier phase freed does not hide the next phase's RSS growth."""
    gc.collect()
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        libc = ctypes.CDLL(libc_name)
        if hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)


class MemoryWindow:
    """Peak memory from now on: CUDA peak allocated/reserved on GPU; RSS high-water mark and its growth
    over the RSS at the window's start on CPU. The trial opens one after setup and a warm-up pass; the
    benchmarks open one per benchmark."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        release_freed_memory()
        synchronize(device)
        self.rss_baseline_bytes = current_rss_bytes()
        reset_peaks(device)

    def rss_growth_bytes(self) -> int | None:
        """RSS now over the window's baseline (None where /proc is absent)."""
        now = current_rss_bytes()
        return None if now is None or self.rss_baseline_bytes is None else now - self.rss_baseline_bytes

    def fill(self, record: Any) -> None:
        """Set the record's peak fields (peak_cuda_*, peak_rss_bytes, peak_rss_growth_bytes)."""
        record.peak_cuda_allocated_bytes, record.peak_cuda_reserved_bytes = cuda_peaks(self.device)
        record.peak_rss_bytes = peak_rss_bytes()
        if record.peak_rss_bytes is not None and self.rss_baseline_bytes is not None:
            record.peak_rss_growth_bytes = record.peak_rss_bytes - self.rss_baseline_bytes


def cuda_peaks(device: torch.device) -> tuple[int | None, int | None]:
    """(peak allocated, peak reserved) bytes since the last reset; (None, None) off CUDA."""
    if device.type != "cuda":
        return None, None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: torch.device) -> float:
    """perf_counter() after the device has finished its queued work: the only honest CUDA timestamp."""
    synchronize(device)
    return time.perf_counter()


def median_iqr(values: list[float]) -> tuple[float | None, float | None]:
    """Median and inter-quartile range; robust to the odd slow step a shared machine throws in."""
    if not values:
        return None, None
    if len(values) < 2:
        return values[0], 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return statistics.median(values), q3 - q1


class StepTimer:
    """Named timestamps within one train step, read as intervals once the step is done.

    On CUDA each mark records an event on the current stream and `intervals` synchronizes once, on the
    last event, so the device runs the step as an untimed loop would; on CPU marks are perf_counter().
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: dict[str, torch.cuda.Event | float] = {}

    def mark(self, name: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks[name] = event
        else:
            self.marks[name] = time.perf_counter()

    def seconds(self, start: str, end: str) -> float:
        """Seconds between two marks; on CUDA the first call waits for the last recorded event."""
        first, last = self.marks[start], self.marks[end]
        if self.cuda:
            list(self.marks.values())[-1].synchronize()
            return first.elapsed_time(last) / 1e3
        return last - first


def copy_bandwidth_bytes_per_s(device: torch.device, nbytes: int = 128 * 2**20, repeats: int = 5) -> float:
    """This device's memory bandwidth as a large tensor copy sees it: bytes read + written per second,
    best of `repeats` (the roofline an optimizer step's memory traffic is compared with)."""
    source = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        start = clock(device)
        target.copy_(source)
        best = min(best, clock(device) - start)
    del source, target
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the copy's blocks must not sit in the trial's reserved memory
    return 2 * nbytes / best


SLOWDOWN_ENV = "OPTBENCH_TEST_OPTIMIZER_SLOWDOWN"


def injected_slowdown(elapsed_s: float) -> None:
    """Test-only knob: with OPTBENCH_TEST_OPTIMIZER_SLOWDOWN=0.3 each optimizer.step() takes 30 % longer.

    The regression gate's tests and the nightly's red-night check use it to make a known slowdown."""
    fraction = float(os.environ.get(SLOWDOWN_ENV) or 0)
    if fraction > 0:
        time.sleep(fraction * elapsed_s)


def slow_down_if_asked(optimizer: torch.optim.Optimizer) -> None:
    """Wrap `optimizer.step` so it sleeps per `injected_slowdown`; a no-op unless the knob is set."""
    if not float(os.environ.get(SLOWDOWN_ENV) or 0):
        return
    step = optimizer.step

    def slowed_step(*args, **kwargs):
        start = time.perf_counter()
        result = step(*args, **kwargs)
        injected_slowdown(time.perf_counter() - start)
        return result

    optimizer.step = slowed_step
