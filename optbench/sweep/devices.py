"""Which GPUs and threads each trial process gets, and what the forkserver may preload: pure functions.

Every CUDA trial process sees exactly its own GPU(s) through CUDA_VISIBLE_DEVICES, chosen from the GPUs *this*
process may use (the user's mask — indices or GPU UUIDs — is indexed into, never replaced): a single-process
trial one GPU (so HF Trainer cannot wrap the model in DataParallel and every library's "cuda" is the trial's
GPU), a torchrun group of N ranks N GPUs. With `--jobs J` the J slots get disjoint GPUs. A pinned trial sees its
GPU as cuda:0; OPTBENCH_GPU_PINNED tells it so (`trial.resolve_device`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from optbench.records.environment import GPU_PINNED_ENV

BITSANDBYTES_PRELOAD = ("bitsandbytes",)  # ~5.5 s to import on CPU; it probes CUDA when it is imported


def visible_gpus(environ: Mapping[str, str], count: int) -> list[str]:
    """The GPUs this process may hand out, as CUDA_VISIBLE_DEVICES entries (indices or UUIDs), in order."""
    mask = environ.get("CUDA_VISIBLE_DEVICES")
    if mask is None:
        return [str(i) for i in range(count)]
    return [entry.strip() for entry in mask.split(",") if entry.strip()][:count]


def gpu_slots(visible: list[str], jobs: int, nproc: int) -> int:
    """How many trials can run at once on these GPUs: `jobs`, but never two trials on one GPU."""
    return max(1, min(jobs, len(visible) // max(1, nproc)))


def wants_cuda(device: str, gpus: int) -> bool:
    """A spec's device resolves to CUDA here: `cuda`, `cuda:N`, or `auto` with a GPU visible."""
    return device.startswith("cuda") or (device == "auto" and gpus > 0)


def trial_environment(device: str, nproc: int, slot: int, visible: list[str], jobs: int,
                      cpu_count: int) -> dict[str, str]:
    """The environment one trial process adds to its own: its GPU mask, or its CPU thread share.

    `device` is the spec's (`cpu`, `auto`, `cuda`, `cuda:N`); `slot` is which of the `jobs` concurrent slots runs
    it. `cuda:N` pins the Nth visible GPU whatever the slot (the planner refuses an index with torchrun groups).
    """
    if wants_cuda(device, len(visible)):
        _, _, index = device.partition(":")
        if index:
            chosen = [visible[int(index)]] if int(index) < len(visible) else [index]
        else:
            chosen = visible[slot * nproc: (slot + 1) * nproc] or visible[:nproc]
        return {"CUDA_VISIBLE_DEVICES": ",".join(chosen), GPU_PINNED_ENV: "1"}
    if jobs == 1:
        return {}
    threads = str(max(1, cpu_count // jobs))
    return {"OPTBENCH_TORCH_THREADS": threads, "OMP_NUM_THREADS": threads}


def preload_modules(base: tuple[str, ...], uses_bitsandbytes: bool, gpus: int) -> tuple[str, ...]:
    """What the forkserver imports once for the whole sweep. bitsandbytes only where no GPU is visible: its import
    initialises CUDA, and a process forked after that cannot use CUDA — neither a GPU trial nor a CPU trial's
    environment stamp. multiprocessing keeps one forkserver per process, so this must hold for every later sweep
    in the same process too, which the GPU count alone guarantees."""
    return base + (BITSANDBYTES_PRELOAD if uses_bitsandbytes and gpus == 0 else ())


def cuda_device_count() -> int:
    """GPUs this process could use, counted through NVML (no CUDA context: children must be free to use theirs)."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
