"""Probes: optimizer-state bytes, peak memory and synchronized timing.

Each probe exists because the obvious way to measure gets it wrong:
- optimizer state is created lazily on the first step() and bitsandbytes shares its quantisation maps
  across parameters, so state is counted after training, one storage at a time;
- tensor subclasses (torchao's quantised states) report the element size of the dtype they pretend
  to be, so they are counted through their inner tensors (`__tensor_flatten__`);
- CUDA kernels run asynchronously, so every timed region is bracketed by a synchronize;
- tracemalloc does not see tensor memory, so CPU peaks come from the kernel's VmHWM, which can be
  reset by writing 5 to /proc/self/clear_refs.
"""

from __future__ import annotations

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


SLOWDOWN_ENV = "OPTBENCH_TEST_OPTIMIZER_SLOWDOWN"


def injected_slowdown(elapsed_s: float) -> None:
    """Sleep `fraction x elapsed_s` when $OPTBENCH_TEST_OPTIMIZER_SLOWDOWN holds a fraction (e.g. 0.3).

    Called inside a timed optimizer.step() interval, it makes the step that much slower on purpose: the
    only way to prove end to end that the regression gate catches a real slowdown. Unset: no cost.
    """
    text = os.environ.get(SLOWDOWN_ENV)
    if not text:
        return
    try:
        fraction = float(text)
    except ValueError:
        raise ValueError(f"${SLOWDOWN_ENV} must be a fraction such as 0.3, got {text!r}") from None
    if not 0 <= fraction < float("inf"):
        raise ValueError(f"${SLOWDOWN_ENV} must be a finite fraction >= 0, got {text!r}")
    time.sleep(fraction * elapsed_s)
