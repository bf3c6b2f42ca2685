"""The CUDA path: peak reset, event timing against a synchronized wall clock, bitsandbytes on the GPU.

These run only where torch sees a CUDA device (`scripts/gpu-check` runs them and a nightly-size sweep);
elsewhere each is skipped with the reason.
"""

from __future__ import annotations

import time

import pytest
import torch

from optbench import measure
from optbench.plan import TrialSpec
from optbench.trial import run_trial

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is visible")]
CUDA = torch.device("cuda")


def test_peak_reset_forgets_an_earlier_allocation():
    big = torch.empty(256 * 2**20, dtype=torch.uint8, device=CUDA)
    del big
    window = measure.MemoryWindow(CUDA)
    small = torch.empty(2**20, dtype=torch.uint8, device=CUDA)
    allocated, _ = measure.cuda_peaks(CUDA)
    assert small.numel() <= allocated - 0 < 64 * 2**20, allocated
    assert window.rss_baseline_bytes is not None


def test_event_timing_agrees_with_a_synchronized_wall_clock_on_a_long_step():
    a = torch.randn(4096, 4096, device=CUDA)
    timer = measure.StepTimer(CUDA)
    torch.cuda.synchronize()
    wall_start = time.perf_counter()
    timer.mark("start")
    for _ in range(50):
        a = a @ a / a.norm()
    timer.mark("end")
    events_s = timer.seconds("start", "end")
    wall_s = time.perf_counter() - wall_start
    assert events_s > 0.01
    assert events_s == pytest.approx(wall_s, rel=0.1)


@pytest.mark.parametrize("optimizer", ["adamw", "adamw8bit"])
def test_a_trial_on_cuda_records_cuda_peaks_and_exact_state(optimizer):
    record = run_trial(TrialSpec(optimizer=optimizer, workload="tiny", device="cuda", steps=10, warmup_steps=2,
                                 batch_size=8, seq_len=32, eval_size=64))
    assert record.status == "ok", record.error
    assert record.device.startswith("cuda") and record.env["gpu"]
    assert record.peak_cuda_allocated_bytes >= record.weights_bytes + record.state_bytes
    assert record.peak_cuda_reserved_bytes >= record.peak_cuda_allocated_bytes
    assert record.state_bytes == record.analytic_state_bytes
    assert all(t > 0 for t in record.step_time_samples_s)


def test_fp16_autocast_on_cuda_uses_a_grad_scaler():
    record = run_trial(TrialSpec(optimizer="adamw", workload="tiny", device="cuda", precision="fp16-autocast",
                                 steps=6, warmup_steps=1, batch_size=8, seq_len=32, eval_size=64))
    assert record.status == "ok", record.error
    assert record.autocast_dtype == "float16"
