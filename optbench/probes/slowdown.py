"""A test-only knob, and only here: OPTBENCH_TEST_OPTIMIZER_SLOWDOWN=0.3 makes every optimizer.step() take 30 %
longer. The regression gate's tests, its campaign and the nightly's red-night check use it to make a known slowdown.

Production code reaches it through one seam: `Setup.install_optimizer` (optbench/trial/engines/base.py), the one
place a trial's optimizer is made; the benchmark suite's steps call `slow_down_if_asked` themselves. Unset, the
knob changes nothing: the optimizer's step is left as it was built.
"""

from __future__ import annotations

import os
import time
import types

import torch

from optbench.probes.timing import clock

SLOWDOWN_ENV = "OPTBENCH_TEST_OPTIMIZER_SLOWDOWN"


def busy_wait(seconds: float) -> None:
    """Hold the core for `seconds`, spinning on the clock: the way work would, not the way a sleep does."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def injected_slowdown(elapsed_s: float) -> None:
    """Busy-wait the knob's share of `elapsed_s` (nothing when unset).

    A spin, not a sleep: a sleep hands the core away, and the process then comes back late (a scheduler's wake-up
    on a shared or virtual machine takes up to milliseconds) and to a cooler machine (idle cores clocked down, the
    thread pool parked, caches refilled by whoever ran meanwhile), which slows the steps around the sleep too; an
    injected +15 % read +13 … +31 % and +30 % read +49 … +72 % with the sleep (docs/benchmarks.md). A spin keeps
    the core as busy as real work would and ends within microseconds of its mark."""
    fraction = float(os.environ.get(SLOWDOWN_ENV) or 0)
    if fraction > 0:
        busy_wait(fraction * elapsed_s)


def slow_down_if_asked(optimizer: torch.optim.Optimizer) -> None:
    """Wrap `optimizer.step` so it waits per `injected_slowdown`; a no-op unless the knob is set.

    On CUDA `step()` only queues kernels: the device is synchronized before and after it, so the wait is a
    fraction of the step's device time (and queued backward work is not counted), and the GPU idles through it:
    the optimizer interval grows by that fraction, as a real slowdown would make it."""
    if not float(os.environ.get(SLOWDOWN_ENV) or 0):
        return
    step = optimizer.step
    params = [p for group in optimizer.param_groups for p in group["params"]]
    device = params[0].device if params else torch.device("cpu")

    def slowed_step(_optimizer, *args, **kwargs):
        start = clock(device)
        result = step(*args, **kwargs)
        injected_slowdown(clock(device) - start)
        return result

    # A bound method, as `step` was: torch's LR schedulers wrap `optimizer.step.__func__`; one that already
    # wrapped it still finds its mark (the inner step it wrapped still records that the optimizer stepped).
    if hasattr(step, "_wrapped_by_lr_sched"):
        slowed_step._wrapped_by_lr_sched = True
    optimizer.step = types.MethodType(slowed_step, optimizer)
