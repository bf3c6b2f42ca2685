"""Which GPUs and threads each trial process gets, and what the forkserver may preload: pure functions.

Every CUDA trial process sees exactly its own GPU(s) through CUDA_VISIBLE_DEVICES, chosen from the GPUs *this*
process may use (the user's mask — indices or GPU UUIDs — is indexed into, never replaced): a single-process
trial one GPU (so HF Trainer cannot wrap the model in DataParallel and every library's "cuda" is the trial's
GPU), a torchrun group of N ranks N GPUs. With `--jobs J` the J slots get disjoint GPUs. A pinned trial sees its
GPU as cuda:0; OPTBENCH_GPU_PINNED tells it so (`job.devices.resolve_device`). Every function here reads the
environment it is given, never os.environ: the sweep reads its own once, before any trial starts.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator, Mapping

from optbench.job.devices import GPU_PINNED_ENV, device_kind

BITSANDBYTES_PRELOAD = ("bitsandbytes",)  # ~5.5 s to import on CPU; it probes CUDA when it is imported
# The built-in workloads' model code (BERT: tiny and MiniLM; Llama: lm), imported otherwise by every trial: ~1.9 s
# of a 3 s tiny trial on CPU. Where torchao is installed, transformers imports it with them, and torchao asks the
# GPU's compute capability when it is imported, which initialises CUDA.
MODEL_PRELOAD = ("transformers.models.bert.modeling_bert", "transformers.models.llama.modeling_llama")


def visible_gpus(environ: Mapping[str, str], count: int) -> list[str]:
    """The GPUs this process may hand out, as CUDA_VISIBLE_DEVICES entries (indices or UUIDs), in order."""
    mask = environ.get("CUDA_VISIBLE_DEVICES")
    if mask is None:
        return [str(i) for i in range(count)]
    return [entry.strip() for entry in mask.split(",") if entry.strip()][:count]


def gpu_slots(visible: list[str], jobs: int, nproc: int) -> int:
    """How many trials can run at once on these GPUs: `jobs`, but never two trials on one GPU."""
    return max(1, min(jobs, len(visible) // max(1, nproc)))


def trial_environment(device: str, nproc: int, slot: int, visible: list[str], jobs: int,
                      cpu_count: int) -> dict[str, str]:
    """The environment one trial process adds to its own: its GPU mask, or its CPU thread share.

    `device` is the spec's (`cpu`, `auto`, `cuda`, `cuda:N`); `slot` is which of the `jobs` concurrent slots runs
    it. On the CPU the `cpu_count` cores are shared among the slots and, within one, among a torchrun group's
    `nproc` ranks (one process alone keeps torch's own default). `cuda:N` pins the Nth visible GPU whatever the
    slot (the planner refuses an index with torchrun groups; `GpuLocks` keeps two slots off one GPU); an N past
    the visible GPUs is a DeviceError. A `cpu` trial sees no GPU: a library that probes CUDA on import
    (bitsandbytes asks every GPU's capability) would otherwise make the CPU trial a CUDA context on a GPU another
    trial is timing on.
    """
    if device_kind(device, len(visible)) == "cuda":
        share = visible[slot * nproc: (slot + 1) * nproc] or visible[:nproc]
        chosen = [pinned_gpu(device, visible)] if ":" in device else share
        return {"CUDA_VISIBLE_DEVICES": ",".join(chosen), GPU_PINNED_ENV: "1"}
    hidden = {"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}
    if jobs == 1 and nproc == 1:
        return hidden
    threads = str(max(1, cpu_count // (jobs * nproc)))  # a torchrun group's ranks share their slot's cores
    return {**hidden, "OPTBENCH_TORCH_THREADS": threads, "OMP_NUM_THREADS": threads}


class DeviceError(ValueError):
    """A device no GPU here answers to (`cuda:N` past the visible ones): a usage error, before any trial runs."""


def pinned_gpu(device: str, visible: list[str]) -> str:
    """The mask entry `cuda:N` names: the Nth GPU this process may use, never the raw N (outside the user's
    CUDA_VISIBLE_DEVICES that would be another user's GPU, or none)."""
    index = int(device.partition(":")[2])
    if not 0 <= index < len(visible):
        if not visible:
            raise DeviceError(f"device '{device}' asked for, but no GPU is visible here (use --device cpu)")
        raise DeviceError(f"device '{device}' asked for, but only {len(visible)} GPU(s) are visible here "
                          f"(CUDA_VISIBLE_DEVICES entries {','.join(visible)}); use cuda:0 to cuda:{len(visible) - 1}")
    return visible[index]


def check_devices(devices: Iterable[str], visible: list[str]) -> None:
    """Every `cuda:N` among `devices` names a visible GPU (raises DeviceError naming the first that does not)."""
    for device in sorted(set(devices)):
        if device.startswith("cuda:"):
            pinned_gpu(device, visible)


class GpuLocks:
    """One lock per GPU: a trial holds its GPUs' locks while it runs, so two trials never share one, whatever
    their slots (a pinned `cuda:N` with `--jobs J` would otherwise put all J slots on GPU N)."""

    def __init__(self) -> None:
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    @contextlib.contextmanager
    def hold(self, environment: Mapping[str, str]) -> Iterator[None]:
        """Wait for, then hold, the GPUs in `environment`'s CUDA_VISIBLE_DEVICES (in one order: no deadlock)."""
        entries = sorted({e for e in environment.get("CUDA_VISIBLE_DEVICES", "").split(",") if e})
        with self._guard:
            locks = [self._locks.setdefault(entry, threading.Lock()) for entry in entries]
        with contextlib.ExitStack() as held:
            for lock in locks:
                held.enter_context(lock)
            yield


def preload_modules(base: tuple[str, ...], uses_bitsandbytes: bool, gpus: int) -> tuple[str, ...]:
    """What the forkserver imports once for the whole sweep. The model code and bitsandbytes only where no GPU is
    visible: importing either can initialise CUDA, and a process forked after that cannot use CUDA — neither a GPU
    trial nor a CPU trial's environment stamp. multiprocessing keeps one forkserver per process, so this must hold
    for every later sweep in the same process too, which the GPU count alone guarantees."""
    if gpus:
        return base
    return base + MODEL_PRELOAD + (BITSANDBYTES_PRELOAD if uses_bitsandbytes else ())


def node_environment(env: Mapping[str, str]) -> dict[str, str]:
    """What travels to a slurm node: not the submit host's GPU mask (slurm sets the node's own)."""
    return {k: v for k, v in env.items() if k not in ("CUDA_VISIBLE_DEVICES", GPU_PINNED_ENV)}
