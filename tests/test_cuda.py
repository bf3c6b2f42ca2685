"""The CUDA path on a real GPU: allocator peaks and pauses, event timing on the right GPU's stream, memory outside
torch's allocator (paged bitsandbytes state), fp16 with a GradScaler, the memory cap, the bandwidth probe, the
injected slowdown, the three engines, and a CPU trial that leaves CUDA alone.

Each test needs what it says in its skip reason; `scripts/gpu-check` runs them (`pytest -m cuda`). The same
logic is tested without a GPU where it can be: tests/test_cuda_seams.py, test_measure.py, test_engines.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from _overflow import overflow_at

from optbench.job.spec import TrialSpec
from optbench.probes import measure, slowdown, stream
from optbench.trial.run import run_trial

pytestmark = pytest.mark.cuda
# cuda:0, not cuda: an in-process trial resolves `cuda` without an index until job.devices.resolve_device is fixed
# (tests/test_cuda_seams.py); the sweep pins each trial's GPU, where `cuda` works.
JOB = dict(workload="tiny", device="cuda:0", steps=10, warmup_steps=2, batch_size=8, seq_len=32, eval_size=64)


def need_gpus(count: int, what: str) -> torch.device:
    """Skip unless `count` GPUs are visible; the first one otherwise."""
    if not torch.cuda.is_available():
        pytest.skip(f"needs a CUDA device: {what}")
    if torch.cuda.device_count() < count:
        pytest.skip(f"needs {count} CUDA devices ({torch.cuda.device_count()} visible): {what}")
    return torch.device("cuda", 0)


def test_peak_reset_forgets_an_earlier_allocation():
    cuda = need_gpus(1, "torch's CUDA allocator peak counters")
    big = torch.empty(256 * 2**20, dtype=torch.uint8, device=cuda)
    del big
    window = measure.MemoryWindow(cuda)
    small = torch.empty(2**20, dtype=torch.uint8, device=cuda)
    allocated, reserved = measure.cuda_peaks(cuda)
    assert small.numel() <= allocated < 64 * 2**20  # the 256 MiB before the window is forgotten
    assert reserved >= allocated and window.device_used_baseline_bytes > 0


def test_a_pause_keeps_an_evaluations_memory_out_of_the_cuda_peak():
    cuda = need_gpus(1, "the allocator peak around MemoryWindow.paused")
    window = measure.MemoryWindow(cuda)
    kept = torch.ones(16 * 2**20 // 4, device=cuda)
    with window.paused():
        logits = torch.ones(512 * 2**20 // 4, device=cuda)  # an LM evaluation's fp32 logits
        del logits
    record = measure_record(window)
    assert 16 * 2**20 <= record.peak_cuda_allocated_bytes < 256 * 2**20
    del kept


def test_a_pause_keeps_an_evaluations_cache_out_of_the_reserved_peak():
    cuda = need_gpus(1, "the allocator's reserved peak around MemoryWindow.paused")
    torch.cuda.empty_cache()
    window = measure.MemoryWindow(cuda)
    kept = torch.ones(16 * 2**20 // 4, device=cuda)
    with window.paused():
        logits = torch.ones(512 * 2**20 // 4, device=cuda)
        del logits  # cached by the allocator until empty_cache
    record = measure_record(window)
    assert record.peak_cuda_reserved_bytes < 256 * 2**20
    del kept


def test_the_bandwidth_probe_warms_the_clock_up_first():
    cuda = need_gpus(1, "back-to-back passes before the timed ones")
    a = torch.ones(64 * 2**20, device=cuda)
    passes = stream.warm_up_clocks(cuda, lambda: a.add_(1.0))
    assert passes > 1  # a 256 MiB pass lasts well under the warm-up


def test_a_cpu_trials_environment_hides_the_gpus_from_bitsandbytes():
    from optbench.sweep.devices import trial_environment

    need_gpus(1, "a GPU that bitsandbytes' import would otherwise initialise CUDA on")
    env = trial_environment("cpu", 1, 0, ["0"], 1, 4)
    code = "import torch, bitsandbytes; print(torch.cuda.is_initialized(), torch.cuda.is_available())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**os.environ, **env})
    assert result.stdout.split() == ["False", "False"], result.stderr


def measure_record(window: measure.MemoryWindow):
    from optbench.records.record import Record

    record = Record()
    window.fill(record)
    return record


def _matmuls(device: torch.device) -> None:
    a = torch.randn(4096, 4096, device=device)
    for _ in range(50):
        a = a @ a / a.norm()


def test_event_timing_agrees_with_a_synchronized_wall_clock_on_a_long_step():
    cuda = need_gpus(1, "CUDA events")
    timer = measure.StepTimer(cuda)
    torch.cuda.synchronize()
    wall_start = time.perf_counter()
    timer.mark("start")
    _matmuls(cuda)
    timer.mark("end")
    events_s = timer.seconds("start", "end")
    wall_s = time.perf_counter() - wall_start
    assert events_s > 0.01
    assert events_s == pytest.approx(wall_s, rel=0.1)


def test_step_timer_times_on_its_devices_stream_when_another_gpu_is_current():
    need_gpus(2, "a timer for GPU 1 while GPU 0 is current (events on GPU 0 would time launches only)")
    second = torch.device("cuda", 1)
    torch.cuda.set_device(0)
    timer = measure.StepTimer(second)
    torch.cuda.synchronize(second)
    wall_start = time.perf_counter()
    timer.mark("start")
    _matmuls(second)
    timer.mark("end")
    events_s = timer.seconds("start", "end")
    assert events_s == pytest.approx(time.perf_counter() - wall_start, rel=0.2)


@pytest.mark.parametrize("optimizer", ["adamw", "adamw8bit"])
def test_a_trial_on_cuda_records_cuda_peaks_and_exact_state(optimizer):
    need_gpus(1, "a whole trial on the GPU")
    record = run_trial(TrialSpec(optimizer=optimizer, **JOB))
    assert record.status == "ok", record.error
    assert record.device == "cuda:0" and record.env["gpu"] == torch.cuda.get_device_name(0)
    assert record.peak_cuda_allocated_bytes >= record.weights_bytes + record.state_bytes
    assert record.peak_cuda_reserved_bytes >= record.peak_cuda_allocated_bytes
    assert record.state_bytes == record.analytic_state_bytes and record.paged_state_bytes == 0
    assert record.peak_memory_bytes == record.peak_cuda_allocated_bytes
    # not >= state_bytes: the allocator may place the state in segments it reserved before the window opened
    # (the warm-up pass), so the driver's used memory need not grow at all
    assert record.peak_device_used_growth_bytes is not None and record.peak_device_used_growth_bytes >= 0
    assert record.device_bandwidth_bytes_per_s > 1e11
    assert all(t > 0 for t in record.step_time_samples_s)


def test_paged_state_is_counted_outside_torchs_allocator():
    need_gpus(1, "bitsandbytes' paged (cudaMallocManaged) optimizer state")
    record = run_trial(TrialSpec(optimizer="paged_adamw8bit", **JOB))
    assert record.status == "ok", record.error
    assert record.paged is True and 0 < record.paged_state_bytes <= record.state_bytes
    assert record.peak_memory_bytes == record.peak_cuda_allocated_bytes + record.paged_state_bytes
    assert record.other_peak_bytes == max(0, record.peak_memory_bytes - record.weights_bytes - record.grads_bytes
                                          - record.state_bytes)
    # the driver sees the unified-memory pages the allocator does not
    assert record.peak_device_used_growth_bytes >= record.paged_state_bytes


def test_fp16_skipped_steps_stay_out_of_the_figures_and_the_shadow_stays_finite(monkeypatch):
    need_gpus(1, "fp16 autocast with torch.amp.GradScaler('cuda')")
    overflow_at(monkeypatch, {0, 3})
    record = run_trial(TrialSpec(optimizer="adamw", precision="fp16-autocast", fidelity=True, **JOB))
    assert record.status == "ok", record.error
    skipped = record.skipped_steps  # 0 and 3 forced; the scaler's own first overflows may add more
    assert record.autocast_dtype == "float16" and {0, 3} <= set(skipped)
    first = min(k for k in range(JOB["steps"]) if k not in skipped)  # the step that made the state
    counted = [k for k in range(JOB["steps"]) if k >= JOB["warmup_steps"] and k not in skipped and k != first]
    assert len(record.step_time_samples_s) == len(record.optimizer_step_samples_s) == len(counted)
    readings = [c for c in record.update_cosine_curve if c is not None]
    assert len(readings) == JOB["steps"] - len(skipped)
    assert all(c == pytest.approx(1.0, abs=1e-3) for c in readings)


def test_the_memory_cap_goes_to_the_current_gpu():
    from optbench.sweep.child import cap_memory

    cuda = need_gpus(1, "the caching allocator's per-process memory fraction")
    torch.cuda.set_device(cuda)
    total = torch.cuda.get_device_properties(cuda).total_memory
    try:
        cap_memory(torch.device("cuda"), total // 4)  # no index: the current GPU (torch refuses a bare "cuda")
        assert torch.cuda.get_per_process_memory_fraction(cuda) == pytest.approx(0.25, abs=1e-3)
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(total // 2, dtype=torch.uint8, device=cuda)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, cuda)


def test_the_bandwidth_probe_leaves_no_reserved_memory_behind():
    cuda = need_gpus(1, "the stream bandwidth probe with CUDA events")
    reserved = torch.cuda.memory_reserved(cuda)
    rates = stream.stream_bandwidth_samples(cuda, samples=3)
    assert len(rates) == 3 and min(rates) > 1e11  # any GPU moves > 100 GB/s; the 512 MiB operands time well
    assert torch.cuda.memory_reserved(cuda) <= reserved + 2**20


def test_injected_slowdown_grows_the_optimizer_interval_on_the_gpu(monkeypatch):
    cuda = need_gpus(1, "a launch-only optimizer.step() whose device time the knob must measure")
    params = [torch.nn.Parameter(torch.randn(4096, 4096, device=cuda)) for _ in range(8)]
    for p in params:
        p.grad = torch.randn_like(p)

    def optimizer_interval_s() -> float:
        optimizer = torch.optim.AdamW(params, foreach=True)
        slowdown.slow_down_if_asked(optimizer)
        optimizer.step()  # state
        times = []
        for _ in range(5):
            timer = measure.StepTimer(cuda)
            timer.mark("step")
            optimizer.step()
            timer.mark("stepped")
            times.append(timer.seconds("step", "stepped"))
        return sorted(times)[2]

    plain = optimizer_interval_s()
    monkeypatch.setenv(slowdown.SLOWDOWN_ENV, "2.0")
    assert optimizer_interval_s() > 2 * plain  # about 3x: the sleep follows the device time, not the launch


@pytest.mark.parametrize("engine", ["native", "accelerate", "trainer"])
def test_every_engine_trains_on_the_trials_gpu(engine):
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    need_gpus(1, f"the {engine} engine on a GPU")
    last = f"cuda:{count - 1}"  # another GPU than the default one where there are two or more
    record = run_trial(TrialSpec(optimizer="adamw", engine=engine, **{**JOB, "device": last}))
    assert record.status == "ok", record.error
    assert record.device == last and record.device_name == torch.cuda.get_device_name(count - 1)
    assert record.env["gpu"] == record.device_name and record.peak_cuda_allocated_bytes > record.weights_bytes


# Run in a fresh interpreter: every torch.cuda module's _lazy_init (the one door to CUDA's initialisation) notes
# who called it first, then the trial runs on the CPU; prints the trial's status and GPU stamp, and for each first
# call the innermost frame outside torch.cuda.
TRACE_CUDA_INIT = """
import json, sys, traceback
import torch
callers = []
original = torch.cuda._lazy_init
def traced():
    if not torch.cuda.is_initialized():
        frames = [f for f in traceback.extract_stack()[:-1] if "/torch/cuda/" not in f.filename]
        callers.append(f"{frames[-1].filename}:{frames[-1].lineno}")
    original()
for name, module in list(sys.modules.items()):
    if name.startswith("torch.cuda") and getattr(module, "_lazy_init", None) is original:
        module._lazy_init = traced
from optbench.job.spec import TrialSpec
from optbench.trial.run import run_trial
r = run_trial(TrialSpec(optimizer="adamw", workload="tiny", device="cpu", steps=2, warmup_steps=1, batch_size=4,
                        seq_len=16, eval_size=16))
print(json.dumps({"status": r.status, "gpu": r.env["gpu"], "callers": callers}))
"""


def test_a_cpu_trial_never_initialises_cuda_itself():
    """A forked child cannot initialise CUDA once its parent has, so optbench's code never touches CUDA for a CPU
    trial. A library may: on the H200 (results/nvidia-h200/logs/part1-cuda-tests.log) an in-process CPU trial did
    initialise it, because transformers imports torchao's quantizer where torchao is installed and torchao asks the
    GPU's compute capability when it is imported. A sweep's CPU trial runs with CUDA_VISIBLE_DEVICES="" (sweep/
    devices.py), so there no library can either."""
    need_gpus(1, "a GPU that a CPU trial must not touch")
    result = subprocess.run([sys.executable, "-c", TRACE_CUDA_INIT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[-1])
    assert found["status"] == "ok" and found["gpu"] is None
    assert [caller for caller in found["callers"] if "/optbench/" in caller] == [], found["callers"]
