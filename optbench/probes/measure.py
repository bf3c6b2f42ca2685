"""Probes: optimizer-state bytes, peak memory and the speed summary (timing: probes/timing.py; the stream
bandwidth probe: probes/stream.py).

Each probe exists because the obvious way to measure gets it wrong:
- optimizer state is created lazily on the first step() and bitsandbytes shares its quantisation maps
  across parameters, so state is counted after training, one storage at a time;
- tensor subclasses (torchao's quantised states) report the element size of the dtype they pretend
  to be, so they are counted through their inner tensors (`__tensor_flatten__`);
- torch's CUDA allocator counts only its own allocations: bitsandbytes' paged state (CUDA unified memory)
  is counted apart (`paged_state_bytes`) and the driver's used-memory figure is followed beside the peaks;
- tracemalloc does not see tensor memory, so CPU peaks come from the kernel's VmHWM, which can be
  reset by writing 5 to /proc/self/clear_refs.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import statistics
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from optbench.probes import HOST_SYNCED

# Clocks and step timing live in optbench/probes/timing.py; these stay importable from here for their callers.
from optbench.probes.timing import StepTimer, clock, synchronize  # noqa: F401

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


class MeasurementWarning(UserWarning):
    """A probe could not measure as it should and says so: the figures it names are to be read with care. A trial
    keeps these on its record (`measurement_warnings`); a sweep prints each once."""


def leaf_tensors(value: Any) -> Iterator[torch.Tensor]:
    """Plain tensors holding the bytes of `value`, looking through wrapper subclasses."""
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor and hasattr(value, "__tensor_flatten__"):
            inner_names, _ = value.__tensor_flatten__()
            for inner in inner_names:
                yield from leaf_tensors(getattr(value, inner))
        else:
            yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from leaf_tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from leaf_tensors(item)


def storage_key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def unique_tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (a view or a shared tensor counts once)."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        for leaf in leaf_tensors(t):
            key = storage_key(leaf)
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
            for leaf in leaf_tensors(value):
                key_of_storage = storage_key(leaf)
                if key_of_storage in seen:
                    continue
                seen.add(key_of_storage)
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
    """Start the peaks afresh. Where the kernel refuses to reset VmHWM, the RSS peak is the process's lifetime
    peak (imports and setup included), which is said, not silently recorded as the training window's."""
    if not reset_peak_rss() and peak_rss_bytes() is not None:
        warnings.warn(f"the peak RSS could not be reset ({_CLEAR_REFS} refused the write): peak_rss_bytes and "
                      "peak_rss_growth_bytes count the whole process, setup included", MeasurementWarning,
                      stacklevel=2)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def trim_heap() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them mapped unless asked)."""
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        libc = ctypes.CDLL(libc_name)
        if hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)


def release_freed_memory() -> None:
    """Collect garbage and trim the heap, so memory an earlier phase freed does not hide the next phase's RSS
    growth (a memory window's baseline)."""
    gc.collect()
    trim_heap()


class MemoryWindow:
    """Peak memory from now on: CUDA peak allocated/reserved on GPU; RSS high-water mark and its growth
    over the RSS at the window's start on CPU. The trial opens one after setup and a warm-up pass; the
    benchmarks open one per benchmark. `paused()` keeps work that is not training (an `--eval-every`
    evaluation, a resume check's checkpoint) out of the peaks.

    On CUDA it also follows the device's used memory as the driver counts it (`device_used_bytes`): memory
    allocated outside torch's allocator — bitsandbytes' paged state lives in CUDA unified memory — never reaches
    the allocator's peak counters. The loop calls `sample_device_used()` after each step, outside the timed
    intervals; `fill` takes one more sample and records the growth over the window's start."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        release_freed_memory()
        synchronize(device)
        self.rss_baseline_bytes = current_rss_bytes()
        self._held_peaks: tuple[int, int, int] = (0, 0, 0)  # rss, cuda allocated, cuda reserved before a pause
        reset_peaks(device)
        self.device_used_baseline_bytes = device_used_bytes(device)
        self.device_used_peak_bytes = self.device_used_baseline_bytes
        self._paused_used_bytes = 0  # used memory the pauses left behind (torch caches an evaluation's blocks)
        self.held_after_step_bytes: int | None = None  # RSS growth right after the last optimizer step

    def rss_growth_bytes(self) -> int | None:
        """RSS now over the window's baseline (None where /proc is absent)."""
        now = current_rss_bytes()
        return None if now is None or self.rss_baseline_bytes is None else now - self.rss_baseline_bytes

    def hold_after_last_step(self) -> None:
        """Note what training holds between steps (grads + state + what the allocator keeps, without the transient
        peak inside step()): the RSS growth now, right after the last optimizer step, before zero_grad."""
        self.held_after_step_bytes = self.rss_growth_bytes()

    def sample_device_used(self) -> int | None:
        """Read the device's used memory now and return it (None off CUDA); call it between steps, never inside a
        timed interval. torch's cache only grows, so a reading after each step also holds that step's reserved
        peak."""
        used = device_used_bytes(self.device)
        if used is not None and self.device_used_peak_bytes is not None:
            self.device_used_peak_bytes = max(self.device_used_peak_bytes, used - self._paused_used_bytes)
        return used

    def _peaks(self) -> tuple[int | None, int | None, int | None]:
        """(peak RSS, CUDA peak allocated, CUDA peak reserved) over the window, pauses excluded."""
        allocated, reserved = cuda_peaks(self.device)
        rss = peak_rss_bytes()
        held = self._held_peaks
        return (None if rss is None else max(rss, held[0]), None if allocated is None else max(allocated, held[1]),
                None if reserved is None else max(reserved, held[2]))

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Run the body outside the window: the peaks so far are kept, the body's own peak is not counted, and the
        device memory it leaves cached is taken off later device-used readings (too much only where training later
        reuses those cached blocks)."""
        self._held_peaks = tuple(v or 0 for v in self._peaks())  # type: ignore[assignment]
        used_before = self.sample_device_used()
        try:
            yield
        finally:
            release_freed_memory()
            drop_cuda_cache(self.device)  # else the body's cached blocks become the reserved peak's new floor
            reset_peaks(self.device)
            used_after = device_used_bytes(self.device)
            if used_before is not None and used_after is not None:
                self._paused_used_bytes += max(0, used_after - used_before)

    def fill(self, record: Any) -> None:
        """Set the record's peak fields (peak_cuda_*, peak_rss_bytes, peak_rss_growth_bytes,
        peak_device_used_growth_bytes) and what training held after its last step (rss_growth_after_step_bytes)."""
        record.rss_growth_after_step_bytes = self.held_after_step_bytes
        record.peak_rss_bytes, record.peak_cuda_allocated_bytes, record.peak_cuda_reserved_bytes = self._peaks()
        if record.peak_rss_bytes is not None and self.rss_baseline_bytes is not None:
            record.peak_rss_growth_bytes = record.peak_rss_bytes - self.rss_baseline_bytes
        self.sample_device_used()
        if self.device_used_peak_bytes is not None and self.device_used_baseline_bytes is not None:
            record.peak_device_used_growth_bytes = self.device_used_peak_bytes - self.device_used_baseline_bytes


def drop_cuda_cache(device: torch.device) -> None:
    """Hand torch's cached, unused CUDA blocks back to the driver. A peak reset restarts the reserved peak at what
    is reserved now: blocks an evaluation cached would otherwise count as training's reserved memory."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def device_used_bytes(device: torch.device) -> int | None:
    """Memory in use on the GPU as the driver counts it (total - free, cudaMemGetInfo): torch's reserved segments,
    allocations made around torch (cudaMallocManaged pages resident on the GPU, library workspaces), the CUDA
    context — and other processes' on the same GPU (the process layer gives each trial a GPU of its own).
    None off CUDA. Asks the driver without synchronizing: read it after the step's last event was waited for."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def paged_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of optimizer state in bitsandbytes' paged buffers (cudaMallocManaged, tensors marked `is_paged`): no
    torch allocator counter ever sees them, so a CUDA peak must add them rather than subtract them. 0 elsewhere
    (bitsandbytes keeps tensors under 1e5 elements, and every tensor on CPU, in ordinary memory)."""
    paged: dict[tuple[str, int], int] = {}
    for param_state in optimizer.state.values():
        for leaf in leaf_tensors(list(param_state.values())):
            if getattr(leaf, "is_paged", False):
                paged[storage_key(leaf)] = leaf.untyped_storage().nbytes()
    return sum(paged.values())


def cuda_peaks(device: torch.device) -> tuple[int | None, int | None]:
    """(peak allocated, peak reserved) bytes since the last reset; (None, None) off CUDA."""
    if device.type != "cuda":
        return None, None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)


def median_iqr(values: list[float]) -> tuple[float | None, float | None]:
    """Median and inter-quartile range; robust to the odd slow step a shared machine throws in."""
    if not values:
        return None, None
    if len(values) < 2:
        return values[0], 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return statistics.median(values), q3 - q1


def describe_speed(record: Any, step_times: list[float], optimizer_times: list[float]) -> None:
    """Fill a Record's speed figures: medians, IQRs and the raw samples (after warm-up), and throughput."""
    record.step_time_samples_s, record.optimizer_step_samples_s = step_times, optimizer_times
    record.step_time_median_s, record.step_time_iqr_s = median_iqr(step_times)
    record.optimizer_step_median_s, record.optimizer_step_iqr_s = median_iqr(optimizer_times)
    if record.step_time_median_s:
        record.samples_per_s = record.batch_size / record.step_time_median_s


def optimizer_impl(optimizer: Any) -> str | None:
    """What torch runs for a torch.optim optimizer here: `fused`, `foreach` or `per-tensor loop` (torch decides
    foreach at step time, and on CPU it has no foreach kernels); for bitsandbytes' optimizers (GaLore's 8-bit one
    too) `per-parameter`, on CUDA HOST_SYNCED; None for another library's optimizer. An optimizer made of parts
    (Muon + AdamW) lists each distinct implementation."""
    parts = getattr(optimizer, "parts", None)
    if parts:
        return " + ".join(dict.fromkeys(i for i in map(optimizer_impl, parts) if i)) or None
    if any(cls.__module__.startswith("bitsandbytes.optim") for cls in type(optimizer).__mro__):
        on_cuda = any(p.device.type == "cuda" for g in optimizer.param_groups for p in g["params"])
        return HOST_SYNCED if on_cuda else "per-parameter"  # Optimizer8bit.step syncs after each parameter
    if not any(cls.__module__.startswith("torch.optim") for cls in type(optimizer).__mro__[:-2]):
        return None
    group = optimizer.param_groups[0]
    if group.get("fused"):
        return "fused"
    foreach = group.get("foreach")
    if foreach is None:
        from torch.optim.optimizer import _default_to_fused_or_foreach

        params = [p for g in optimizer.param_groups for p in g["params"]]
        _, foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)
    return "foreach" if foreach else "per-tensor loop"
