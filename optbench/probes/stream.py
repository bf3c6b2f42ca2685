"""The stream probe: the device's memory bandwidth as an optimizer step sees it — torch's fused AdamW update run in
place over four fp32 operands that stand for a step's weights, gradients and two moments (four read, three
written) — sampled around every trial and, many times over, by `optbench calibrate-bandwidth` (probes/bandwidth.py).

Why this kernel and not a STREAM triad (`a += s * b`, which the probe ran before): with two threads, how many
bytes a CPU core moves depends on how many streams it has in flight, not only on the memory. On the 2-core
reference host (scripts/kernel_width_probe.py, results/cpu-2core/kernel-width-probe.json) a triad over 240-960 MiB
working sets streamed 35.7-36.7 GB/s, `addcmul_` (three operands) 36.2-36.6, and the fused AdamW update (four)
39.5-40.5. The fused AdamW step of MiniLM read up to 115 % of a triad's ceiling in trials (memory-level/), and
alone in a process 102 % of its level's. A ceiling a step can exceed is no ceiling: the probe runs the widest
fused streaming kernel torch has, the one the fastest optimizer step runs. On CUDA the SM clock is
warmed up from idle before a pass is timed (an H200's idles at 345 MHz: a cold pass reads low), and the operands
fit the memory left to the trial.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from pathlib import Path
from typing import Any

import torch

from optbench.probes.measure import MeasurementWarning, trim_heap
from optbench.probes.timing import StepTimer, synchronize

_CPU_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
GUESSED_CACHE_BYTES = 32 * 2**20  # the last-level cache assumed where sysfs does not say (a large server's L3)


def last_level_cache_bytes() -> int:
    """The largest CPU cache (sysfs): what a bandwidth buffer must dwarf. Where sysfs does not say, 32 MiB is
    assumed, with a MeasurementWarning: a larger cache would make the bandwidth read too high."""
    sizes = []
    for path in _CPU_CACHE.glob("index*/size"):
        text = path.read_text().strip().upper()
        with contextlib.suppress(ValueError, KeyError, IndexError):
            sizes.append(int(text[:-1]) * {"K": 2**10, "M": 2**20, "G": 2**30}[text[-1]])
    if not sizes:
        warnings.warn(f"the CPU's cache sizes could not be read from {_CPU_CACHE}: the bandwidth probe assumes a "
                      f"{GUESSED_CACHE_BYTES // 2**20} MiB last-level cache (device_bandwidth_bytes_per_s reads too "
                      "high if it is larger)", MeasurementWarning, stacklevel=2)
    return max(sizes, default=GUESSED_CACHE_BYTES)


CUDA_BANDWIDTH_OPERAND_BYTES = 512 * 2**20  # far beyond any L2; a pass lasts long enough for events to time it
MIN_CUDA_BANDWIDTH_OPERAND_BYTES = 16 * 2**20  # below this a reading says more about launch latency than memory


KERNEL = "fused-adamw"  # what a calibration file says it measured with (files without the field: "triad")
OPERANDS = 4  # param, grad, exp_avg, exp_avg_sq: the working set is OPERANDS x one operand
PASS_BYTES_PER_OPERAND = 7  # bytes a pass moves per operand byte: four operands read, three written
FP32_BYTES = 4


def bandwidth_buffer_bytes(device: torch.device, room_bytes: int | None = None) -> int:
    """Bytes per operand: the last-level cache on CPU (four operands: 4x it in all, as the triad's two of twice it
    were); on CUDA 512 MiB, or a fifth of `room_bytes` (what the allocator may still take) where that is less, so
    that a `--max-memory` cap never makes the probe the trial's out-of-memory error."""
    if device.type != "cuda":
        return last_level_cache_bytes()
    if room_bytes is None:
        return CUDA_BANDWIDTH_OPERAND_BYTES
    return min(CUDA_BANDWIDTH_OPERAND_BYTES, room_bytes // (OPERANDS + 1))


def cuda_room_bytes(device: torch.device) -> int:
    """What torch's allocator can still get on `device`: the driver's free memory, and no more than the
    per-process cap (`set_per_process_memory_fraction`) leaves beyond what the allocator already reserved."""
    free, total = torch.cuda.mem_get_info(device)
    fraction = torch.cuda.get_per_process_memory_fraction(device)  # absent in torch 2.5: the floor is 2.11
    return room_bytes(free, total, fraction, torch.cuda.memory_reserved(device))


def room_bytes(free_bytes: int, total_bytes: int, fraction: float, reserved_bytes: int) -> int:
    """The driver's free memory, but no more than the cap (`fraction` of the GPU) leaves beyond what is reserved."""
    return max(0, min(free_bytes, int(fraction * total_bytes) - reserved_bytes))


# The SM clock of an idle GPU sits far below its boost clock (an H200 idles at 345 MHz and boosts to 1980 MHz),
# and a pass over 512 MiB operands lasts a fraction of a millisecond: passes timed before the clock ramps read low,
# and the roofline share computed against them reads high. Sustained work first brings the clock up.
CUDA_WARM_UP_S = 0.25
MOST_WARM_UP_PASSES = 5000


def warm_up_pass_count(pass_s: float, warm_up_s: float = CUDA_WARM_UP_S, most: int = MOST_WARM_UP_PASSES) -> int:
    """Back-to-back passes that keep the device busy for `warm_up_s`, from one pass's time (timed cold, so the
    count errs high); at least one, at most `most`."""
    if pass_s <= 0:
        return most
    return max(1, min(most, math.ceil(warm_up_s / pass_s)))


def warm_up_clocks(device: torch.device, work: Any, warm_up_s: float = CUDA_WARM_UP_S) -> int:
    """Run `work` (a callable launching one pass) back to back until the device was busy for about `warm_up_s`;
    returns the passes run. On CPU nothing: a CPU pass is long and one untimed pass warms it."""
    if device.type != "cuda":
        return 0
    timer = StepTimer(device)
    timer.mark("start")
    work()
    timer.mark("end")
    passes = warm_up_pass_count(timer.seconds("start", "end"), warm_up_s)
    for _ in range(passes):
        work()
    synchronize(device)
    return passes + 1


class StreamKernel:
    """The stream kernel's operands and one timed pass over them: torch's fused AdamW update, in place, over four
    fp32 operands of `operand_bytes` each (a parameter of ones, a 1e-3 gradient and the two moments). The lr is tiny
    so that the values stay finite over any number of passes; the untimed first pass creates the moments, pages
    every operand in and warms the kernel. Bytes are counted as a step's are (optimizers/base.py: weights read and
    written, gradients read, two moments read and written: 7 x the operand size; in place, so no write-allocate
    traffic goes uncounted). Shared by the calibration's samples and `--paired-probe` (probes/paired.py), so both
    time the same work."""

    def __init__(self, device: torch.device, operand_bytes: int) -> None:
        self.device = device
        self.weights = torch.nn.Parameter(
            torch.ones(max(1, operand_bytes // FP32_BYTES), dtype=torch.float32, device=device))
        self.weights.grad = torch.full_like(self.weights, 1e-3)
        self.update = torch.optim.AdamW([self.weights], lr=1e-12, weight_decay=0.0, fused=True)
        self.update.step()  # untimed: creates the two moments, pages every operand in, warms the kernel
        self.moved_bytes = PASS_BYTES_PER_OPERAND * self.weights.nbytes

    def pass_seconds(self) -> float:
        """One pass, timed (CUDA: with events)."""
        timer = StepTimer(self.device)
        timer.mark("start")
        self.update.step()
        timer.mark("end")
        return timer.seconds("start", "end")


def stream_bandwidth_samples(device: torch.device, samples: int = 5, operand_bytes: int | None = None) -> list[float]:
    """The device's memory bandwidth as an optimizer step moves it: one sample per pass of the stream kernel
    (StreamKernel) over operands of `operand_bytes` each (default: ones that dwarf the caches,
    bandwidth_buffer_bytes), with torch's current thread count, CUDA's SM clock warmed up first. No samples where
    the memory left is too small for a meaningful buffer."""
    room = cuda_room_bytes(device) if device.type == "cuda" else None
    nbytes = bandwidth_buffer_bytes(device, room) if operand_bytes is None else operand_bytes
    if device.type == "cuda" and (nbytes < MIN_CUDA_BANDWIDTH_OPERAND_BYTES or (OPERANDS + 1) * nbytes > (room or 0)):
        return []
    kernel = StreamKernel(device, nbytes)
    warm_up_clocks(device, kernel.update.step)  # CUDA: the SM clock up from idle first
    times = [kernel.pass_seconds() for _ in range(samples)]
    moved_bytes = kernel.moved_bytes
    del kernel  # freed by reference count: no garbage collection needed, only the heap trimmed
    trim_heap()
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the operands must not sit in the trial's reserved memory
    return [moved_bytes / t for t in times if t > 0]
