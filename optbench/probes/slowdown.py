"""A test-only knob, and only here: OPTBENCH_TEST_OPTIMIZER_SLOWDOWN=0.3 makes every optimizer.step() take 30 %
longer. The regression gate's tests and the nightly's red-night check use it to make a known slowdown.

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


def injected_slowdown(elapsed_s: float) -> None:
    """Sleep the knob's share of `elapsed_s` (nothing when unset)."""
    fraction = float(os.environ.get(SLOWDOWN_ENV) or 0)
    if fraction > 0:
        time.sleep(fraction * elapsed_s)


def slow_down_if_asked(optimizer: torch.optim.Optimizer) -> None:
    """Wrap `optimizer.step` so it sleeps per `injected_slowdown`; a no-op unless the knob is set.

    On CUDA `step()` only queues kernels: the device is synchronized before and after it, so the sleep is a
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
