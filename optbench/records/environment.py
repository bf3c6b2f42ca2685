"""The environment stamp every record carries: library versions, hardware, threads, load, git commit and whether
the checkout was dirty.

What a reader needs to trust or reproduce a number, and what `compare` checks before it calls two runs
comparable. Reading it costs a `git rev-parse` and a look at /proc, so callers stamp once per trial.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

from optbench.records import nvidia

# Environment-stamp keys that change what a number means: the benchmarks add them to pytest-benchmark's
# machine_info (which has the CPU already), and `compare` warns when two runs differ in any of them.
# Hardware (the CPU's family/model/stepping and the kernel set torch dispatches to, which changes
# floating-point results), libraries and threads.
MACHINE_KEYS = ("gpu", "gpu_driver", "cuda", "cpu_model", "cpu_capability", "torch", "transformers", "datasets",
                "bitsandbytes", "torchao", "torch_threads")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _git(*args: str, cwd: Path = PACKAGE_DIR) -> str | None:
    """A git command's output in the checkout `cwd` is in (this package's, by default); None outside one (an
    installed wheel) or without git. --no-optional-locks: `git status` otherwise takes the index lock to refresh the
    index, and a stamp's git killed at its timeout (or with its trial) left .git/index.lock behind, after which the
    user's own commits failed until they deleted it."""
    try:
        out = subprocess.run(["git", "--no-optional-locks", *args], capture_output=True, text=True, timeout=5,
                             cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def git_commit() -> str | None:
    out = _git("rev-parse", "HEAD")
    return (out or "").strip() or None


# Paths whose changes do not change what a number means: the results the reference steps write while they run (a
# second step would otherwise see the first step's records as a dirty tree).
CLEAN_EXCEPT = ("results",)


def git_dirty(cwd: Path = PACKAGE_DIR) -> bool | None:
    """Whether the checkout differs from its commit: a tracked file changed, or an untracked one (not ignored) was
    added, outside CLEAN_EXCEPT. A number measured from a dirty tree cannot be reproduced from its commit alone.
    None where there is no checkout to ask."""
    excluded = [f":(top,exclude){path}" for path in CLEAN_EXCEPT]
    out = _git("status", "--porcelain", "--", ":(top)", *excluded, cwd=cwd)
    return None if out is None else bool(out.strip())


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty off Linux), read once per process."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_name() -> str:
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_model() -> str | None:
    """Family, model and stepping: virtual machines often show every EPYC or Xeon under one bare brand name,
    while these numbers still tell one CPU generation from another."""
    info = _cpuinfo()
    if "cpu family" not in info:
        return None
    return f"family {info['cpu family']} model {info.get('model', '?')} stepping {info.get('stepping', '?')}"


def load_average_1m() -> float | None:
    """The 1-minute load average when the stamp was taken: above the core count, neighbours shared the CPUs
    and every time measured then carries their work."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def names_cuda(name: str) -> bool:
    """Whether a device name asks for CUDA itself (`cuda`, `cuda:N`), as a record's resolved device does on a GPU;
    `auto` does not (job.devices.device_kind decides it against the GPUs visible)."""
    return name.startswith("cuda")


def gpu_name(device: Any = None) -> str | None:
    """The name of the GPU a trial uses (`device`, a torch.device or index), else of the current one; None
    without CUDA. Asked through torch only when CUDA is already usable here."""
    import torch

    if not torch.cuda.is_available():
        return None
    index = device.index if hasattr(device, "index") else device
    return torch.cuda.get_device_name(torch.cuda.current_device() if index is None else index)


def machine_key(device: Any) -> str:
    """The machine as a file name, for per-machine files (the bandwidth calibration): on CPU the CPU's name and
    family/model/stepping and torch's thread count (the bandwidth a CPU reaches depends on how many threads
    stream), on CUDA the GPU's name."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        text = f"cuda {gpu_name(device)}"
    else:
        text = f"cpu {cpu_name()} {cpu_model() or ''} {torch.get_num_threads()} threads"
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def environment(device: Any = None, packages: Iterable[str] = ("torch", "transformers", "datasets", "bitsandbytes",
                                                               "torchao", "optbench"), runtime: bool = True
                ) -> dict[str, Any]:
    """Library versions, hardware and git commit; `gpu` names the GPU `device` is on (the current one if None).
    `runtime=False`: the stamp of a trial that never ran in this process (skipped, timed out, crashed), without
    importing torch: its CUDA build, CPU kernel set, threads and GPU are None, since none was used."""
    env: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform()}
    env.update({name: _version(name) for name in packages})
    env.update(dict.fromkeys(("cuda", "cpu_capability", "torch_threads", "gpu")))
    env["cpu"] = cpu_name()
    env["cpu_model"] = cpu_model()
    env["cpu_count"] = os.cpu_count()
    env["load_avg_1m"] = load_average_1m()
    env["git_commit"] = git_commit()
    if runtime:
        import torch

        env["cuda"] = torch.version.cuda
        env["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        env["torch_threads"] = torch.get_num_threads()
        on_cpu = device is not None and getattr(device, "type", str(device)) == "cpu"
        env["gpu"] = None if on_cpu else gpu_name(device)
        if env["gpu"] is not None:  # the driver's view: clocks, temperature, ECC, other processes (records/nvidia.py)
            for key, value in nvidia.gpu_stamp(gpu_uuid(device)).items():
                env.setdefault(key, value)
    env["git_dirty"] = git_dirty()
    return env


def gpu_uuid(device: Any = None) -> str | None:
    """The UUID of the GPU a trial uses, as nvidia-smi prints it after `GPU-` (None where torch does not say)."""
    import torch

    index = device.index if hasattr(device, "index") else device
    properties = torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index)
    uuid = getattr(properties, "uuid", None)
    return None if uuid is None else str(uuid)
