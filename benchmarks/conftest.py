"""Benchmark-suite plumbing: the `--optbench-preset` size, the `--optbench-device`, one workload per session, the
registry as params.

The device is resolved once, at start-up, to an indexed device made current (`bench_support.suite_device`): every
benchmark then builds, steps and synchronizes on that GPU, CUDA events and library kernels queue on its stream,
and machine_info names it (not GPU 0 whatever ran).

The workload (MiniLM: ~3 s to build) is built once per session; bitsandbytes (~5 s to import) is
imported by the registry the first time an 8-bit optimizer is built. The optimizers (`--optbench-optimizers`):
`default`, the three default optimizers and the first entry of each other library family
(`optimizers.representatives()`: the suite grows with the families, not with the entries); `all`, every registry
entry; or a list of names. One whose library is missing here, or that the benchmark's loop cannot train (LOMO's
fused backward; an update inside backward has no optimizer.step() to time), is skipped with the reason.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
import torch
from bench_support import SIZES, BenchSize, suite_device, trial_spec

from optbench.optimizers import REGISTRY, OptimizerSpec, UnknownOptimizerError, representatives, resolve

if TYPE_CHECKING:
    from optbench.workloads import Built

# Set before anything imports datasets or transformers (the workload fixture does): never touch the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PRESET_ENV = "OPTBENCH_PRESET"
DEVICE_ENV = "OPTBENCH_DEVICE"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("optbench").addoption(
        "--optbench-preset", choices=sorted(SIZES), default=None,
        help=f"benchmark size: smoke (tiny BERT, CI), default (MiniLM, ~4 min on 2 CPU cores), nightly (GPU); "
             f"default: ${PRESET_ENV} or 'default'")
    parser.getgroup("optbench").addoption(
        "--optbench-optimizers", default="default", metavar="NAMES",
        help="default: the three default optimizers + one entry per library family (~10 on this CPU); all: every "
             "registry entry; or comma-separated registry names (unavailable ones skip)")
    parser.getgroup("optbench").addoption(
        "--optbench-harness", action="store_true",
        help="also run the harness-vs-bare step-time check (test_harness_overhead.py): pairs of runs until its 95 %% "
             "interval resolves the tolerance, 6-20 pairs at the default size, up to ~14 minutes on 2 CPU cores")
    parser.getgroup("optbench").addoption(
        "--optbench-device", default=None, metavar="DEVICE",
        help=f"auto, cpu, cuda or cuda:N (default: ${DEVICE_ENV} or 'auto': the current GPU if any, else the CPU)")


def _preset_name(config: pytest.Config) -> str:
    name = config.getoption("--optbench-preset") or os.environ.get(PRESET_ENV) or "default"
    if name not in SIZES:
        raise pytest.UsageError(f"{PRESET_ENV}={name!r} is not a preset; pick one of {', '.join(sorted(SIZES))}")
    return name


def _device(config: pytest.Config) -> torch.device:
    """The suite's device, resolved once per session (and made current on CUDA)."""
    if not hasattr(config, "_optbench_device"):
        name = config.getoption("--optbench-device") or os.environ.get(DEVICE_ENV) or "auto"
        try:
            config._optbench_device = suite_device(name)
        except ValueError as exc:
            raise pytest.UsageError(f"--optbench-device: {exc}") from None
    return config._optbench_device


def pytest_configure(config: pytest.Config) -> None:
    _preset_name(config)  # a bad OPTBENCH_PRESET fails at start-up, not after the first benchmark


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    from optbench.records.environment import MACHINE_KEYS, environment

    device = _device(config)
    env = environment(device)  # the GPU the suite ran on
    machine_info.update({key: env.get(key) for key in MACHINE_KEYS})
    machine_info.update(load_avg_1m=env.get("load_avg_1m"), git_dirty=env.get("git_dirty"))  # provenance
    machine_info["optbench_preset"] = _preset_name(config)
    machine_info["optbench_device"] = str(device)


@pytest.fixture(scope="session")
def bench_size(pytestconfig: pytest.Config) -> BenchSize:
    return SIZES[_preset_name(pytestconfig)]


@pytest.fixture(scope="session")
def device(pytestconfig: pytest.Config) -> torch.device:
    return _device(pytestconfig)


@pytest.fixture(scope="session")
def workload(bench_size: BenchSize, device: torch.device) -> Built:
    """Built once; each benchmark trains a copy of its model (bench_support.fresh_model)."""
    from optbench.workloads import get_workload

    spec = trial_spec(bench_size, "adamw", device)
    return get_workload(spec.workload).build(spec)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every registry entry (or those of --optbench-optimizers) becomes a parameter of `optimizer_spec`."""
    if "optimizer_spec" in metafunc.fixturenames:
        metafunc.parametrize("optimizer_spec", chosen_names(metafunc.config), ids=str, indirect=True)


def chosen_names(config: pytest.Config) -> list[str]:
    """The registry names `--optbench-optimizers` asks for (default, all, or a comma-separated list)."""
    chosen = config.getoption("--optbench-optimizers").strip()
    if chosen.lower() == "default":
        return representatives()
    if chosen.lower() == "all":
        return list(REGISTRY)
    try:
        return list(dict.fromkeys(resolve(n).name for n in chosen.split(",") if n.strip()))
    except UnknownOptimizerError as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.fixture
def optimizer_spec(request: pytest.FixtureRequest) -> OptimizerSpec:
    spec = REGISTRY[request.param]
    reason = spec.unavailable_reason() or spec.runs_under("native")
    if reason is None and spec.step_in_backward and request.node.name.startswith("test_optimizer_step"):
        reason = f"its update runs inside backward ({spec.step_in_backward}): no optimizer.step() to time"
    if reason is not None:
        pytest.skip(f"{spec.name} unavailable here: {reason}")
    return spec
