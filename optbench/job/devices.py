"""What a device name means here: the one resolver the input check, the sweep, the trial and the memory model share.

A spec's device is `auto`, `cpu`, `cuda` or `cuda:N`. `device_kind` answers "CUDA or CPU?" (what a job key, a
calibration and a GPU slot need); `resolve_device` answers "which torch.device, exactly?" (what the trial and the
memory cap need). GPUs are counted through NVML (`torch.cuda.device_count`), never by initialising CUDA: a
process that did could not fork trials that use it. torch is imported only by a question that needs it (`auto`,
a CUDA device), so planning stays instant.

Where the process layer pinned a trial's GPU (CUDA_VISIBLE_DEVICES holds only that GPU, optbench/sweep/devices.py),
it says so in GPU_PINNED_ENV: the trial's `cuda:N` is then this process's cuda:0.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from optbench.records.environment import names_cuda

if TYPE_CHECKING:
    import torch

GPU_PINNED_ENV = "OPTBENCH_GPU_PINNED"


def usable_cpu_cores() -> int:
    """The CPU cores this process may run on: its affinity mask, which a container or `taskset` may make smaller
    than the machine (os.cpu_count). What a thread count is checked against before it is timed."""
    return len(os.sched_getaffinity(0))


def cuda_device_count() -> int:
    """GPUs this process may use, counted through NVML (no CUDA context); 0 with a CPU build of torch."""
    import torch

    return torch.cuda.device_count()


def device_kind(name: str, gpus: int | None = None) -> str:
    """`cuda` or `cpu`: `cuda` and `cuda:N` are CUDA, `auto` is CUDA where a GPU is visible (`gpus`, counted when
    not given), anything else runs on the CPU side of every figure (RSS peaks, the CPU calibration)."""
    if name == "auto":
        return "cuda" if (cuda_device_count() if gpus is None else gpus) > 0 else "cpu"
    return "cuda" if names_cuda(name) else "cpu"


def resolve_device(name: str) -> torch.device:
    """The torch device a spec's device name means in this process, always with an index on CUDA (torch's
    set_device and the memory cap want one). Where the process layer pinned the trial's GPU, `cuda:N` is this
    process's cuda:0; a bare `cuda` is the current GPU (a torchrun rank has set its own), asked without
    initialising CUDA where nothing has yet. A name that cannot work here is a ValueError saying what to use."""
    import torch

    if name == "auto":
        name = device_kind(name)
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device '{name}'; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":  # torch knows mps, xla, meta...: every figure here is a CPU's or a CUDA device's
        raise ValueError(f"device '{name}' is not one optbench measures on; use auto, cpu, cuda or cuda:N")
    count = cuda_device_count()
    if count == 0:
        raise ValueError(f"device '{name}' asked for, but this torch build sees no CUDA device (use --device cpu)")
    if device.index is None:
        return torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_initialized() else 0)
    if os.environ.get(GPU_PINNED_ENV):
        return torch.device("cuda", 0)
    if device.index >= count:
        raise ValueError(f"device '{name}' asked for, but only {count} GPU(s) are visible")
    return device
