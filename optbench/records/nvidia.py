"""The state of a GPU as its driver reports it (nvidia-smi): what a timing on it needs beside the GPU's name.

A GPU timed while another process uses it, hot and throttling, at an idle clock, or after an ECC error does not
give the figures it gives idle and cool; a driver update alone can move them. So every CUDA trial's environment
stamp carries the driver, the clocks, the temperature, the power draw, the ECC state and the other processes on its
GPU, and `optbench nightly` refuses to time beside another process (its pre-flight) and keys its baseline by GPU,
driver and torch. nvidia-smi, not torch, is asked: it needs no CUDA context, so a parent process (the nightly,
the sweep) can ask before its children take the GPU. Everything here is None where nvidia-smi is absent.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from typing import Any

# nvidia-smi --query-gpu fields, in the order asked, and the stamp key each becomes
GPU_FIELDS = {"index": "index", "uuid": "uuid", "name": "gpu", "driver_version": "gpu_driver",
              "clocks.sm": "gpu_clock_sm_mhz", "clocks.mem": "gpu_clock_mem_mhz",
              "clocks.max.sm": "gpu_clock_max_sm_mhz", "temperature.gpu": "gpu_temperature_c",
              "power.draw": "gpu_power_w", "pstate": "gpu_pstate", "ecc.mode.current": "gpu_ecc_mode",
              "ecc.errors.uncorrected.volatile.total": "gpu_ecc_uncorrected"}
PROCESS_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")
NUMBER = re.compile(r"-?\d+(\.\d+)?")

Runner = Callable[[list[str]], str | None]


def nvidia_smi(args: list[str]) -> str | None:
    """nvidia-smi's output for `args`, None where it is absent or fails (the default runner of every reader here:
    tests pass a fake one)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        result = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


def _value(text: str) -> Any:
    """A csv cell: a number where it is one; None for nvidia-smi's "[N/A]" / "[Not Supported]"."""
    text = text.strip()
    if not text or text.startswith("[") or text == "N/A":
        return None
    return (float(text) if "." in text else int(text)) if NUMBER.fullmatch(text) else text


def parse_rows(text: str, fields: tuple[str, ...]) -> list[dict[str, Any]]:
    """`--format=csv,noheader,nounits` output as one dict per line."""
    rows = []
    for line in text.strip().splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) == len(fields):
            rows.append(dict(zip(fields, map(_value, cells), strict=True)))
    return rows


def gpu_rows(run: Runner | None = None) -> list[dict[str, Any]]:
    text = (run or nvidia_smi)([f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"])
    return parse_rows(text, tuple(GPU_FIELDS)) if text else []


def process_rows(run: Runner | None = None) -> list[dict[str, Any]]:
    text = (run or nvidia_smi)([f"--query-compute-apps={','.join(PROCESS_FIELDS)}", "--format=csv,noheader,nounits"])
    return parse_rows(text, PROCESS_FIELDS) if text else []


def select_gpus(rows: list[dict[str, Any]], mask: str | None) -> list[dict[str, Any]]:
    """The rows CUDA_VISIBLE_DEVICES (`mask`: indices, or UUIDs or their prefixes; None: all) lets a process use."""
    if mask is None:
        return rows
    chosen = []
    for entry in (e.strip() for e in mask.split(",") if e.strip()):
        match = [r for r in rows if str(r["index"]) == entry or str(r["uuid"]).startswith(entry)]
        chosen += [r for r in match[:1] if r not in chosen]
    return chosen


def other_processes(gpu: Mapping[str, Any], processes: list[dict[str, Any]], own_pids: set[int]) -> list[str]:
    """`pid name (MiB)` of each compute process on `gpu` that is not one of `own_pids`."""
    return [f"{p['pid']} {p['process_name']} ({p['used_memory']} MiB)" for p in processes
            if p["gpu_uuid"] == gpu["uuid"] and p["pid"] not in own_pids]


def stamp(gpu: Mapping[str, Any], processes: list[dict[str, Any]], own_pids: set[int]) -> dict[str, Any]:
    """The environment-stamp fields of one GPU (GPU_FIELDS' keys, and `gpu_other_processes`)."""
    fields = {key: gpu[field] for field, key in GPU_FIELDS.items() if field not in ("index", "uuid")}
    return {**fields, "gpu_other_processes": other_processes(gpu, processes, own_pids)}


def gpu_stamp(uuid: str | None = None, run: Runner | None = None) -> dict[str, Any]:
    """The stamp of the GPU with `uuid` (torch's device UUID, without nvidia-smi's `GPU-`), else of the only GPU
    this process may use; {} where nvidia-smi is absent or the GPU is not found."""
    rows = gpu_rows(run)
    if uuid is not None:
        rows = [r for r in rows if str(r["uuid"]).removeprefix("GPU-") == uuid.removeprefix("GPU-")]
    else:
        rows = select_gpus(rows, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if len(rows) != 1:
        return {}
    return stamp(rows[0], process_rows(run), {os.getpid()})


def preflight(mask: str | None, run: Runner | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Before a night: the stamp of every GPU `mask` allows, and one line per GPU another process uses (a night
    timed beside it measures the other process too)."""
    rows = select_gpus(gpu_rows(run), mask)
    processes = process_rows(run)
    stamps = [stamp(row, processes, {os.getpid()}) for row in rows]
    busy = [f"GPU {row['index']} ({row['name']}) is in use by {', '.join(s['gpu_other_processes'])}"
            for row, s in zip(rows, stamps, strict=True) if s["gpu_other_processes"]]
    return stamps, busy


def baseline_key(env: Mapping[str, Any]) -> str:
    """What a timing baseline is only valid for: the GPU (or CPU) model, the GPU driver and torch's version, as one
    file-name-safe string (`nvidia-h200_driver-580.159.04_torch-2.11.0`)."""
    machine = env.get("gpu") or env.get("cpu_model") or env.get("cpu") or "unknown"
    parts = [str(machine), f"driver-{env.get('gpu_driver') or 'none'}", f"torch-{env.get('torch') or 'none'}"]
    return "_".join(re.sub(r"[^A-Za-z0-9.+-]+", "-", part).strip("-").lower() for part in parts)
