"""Probes: each storage counted once, wrapper subclasses through their inner tensors, peaks (paused work and
memory outside torch's allocator), stats, the bandwidth probe, step intervals and the injected slowdown."""

import warnings
from types import SimpleNamespace

import pytest
import torch
from torch.utils._pytree import tree_map

from optbench.probes import measure, slowdown, stream, timing
from optbench.probes.timing import STEP_MARKS
from optbench.records.record import Record


class Quantized(torch.Tensor):
    """A minimal wrapper subclass in the style of torchao's quantised optimizer states: it pretends to
    be a float32 tensor of `shape` but holds uint8 codes plus one fp32 scale per 64-element block."""

    @staticmethod
    def __new__(cls, codes, scale, shape):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.float32)

    def __init__(self, codes, scale, shape):
        self.codes, self.scale = codes, scale

    def __tensor_flatten__(self):
        return ["codes", "scale"], [self.shape]

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda t: t.codes.float() if isinstance(t, Quantized) else t  # noqa: E731
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))


class _FakeOptimizer:
    def __init__(self, state):
        self.state = state


def test_subclass_is_counted_through_its_inner_tensors():
    q = Quantized(torch.zeros(4096, dtype=torch.uint8), torch.zeros(64), (4096,))
    assert q.element_size() * q.numel() == 4 * 4096  # what a naive count would charge
    total, by_key = measure.optimizer_state_bytes(_FakeOptimizer({0: {"exp_avg": q}}))
    assert total == 4096 + 64 * 4
    assert by_key == {"exp_avg": 4096 + 256}


def test_shared_and_viewed_storages_count_once():
    shared = torch.zeros(256)
    big = torch.zeros(1000)
    state = {0: {"qmap": shared, "m": big}, 1: {"qmap": shared, "m": big[:10]}, 2: {"step": 3}}
    total, by_key = measure.optimizer_state_bytes(_FakeOptimizer(state))
    assert total == 256 * 4 + 1000 * 4
    assert by_key == {"m": 4000, "qmap": 1024}
    assert measure.unique_tensor_bytes([big, big[5:], shared]) == 5024


def test_median_and_iqr():
    assert measure.median_iqr([]) == (None, None)
    assert measure.median_iqr([2.0]) == (2.0, 0.0)
    median, iqr = measure.median_iqr([1.0, 2.0, 3.0, 4.0, 100.0])
    assert median == 3.0 and iqr == pytest.approx(2.0)


@pytest.mark.skipif(measure.peak_rss_bytes() is None, reason="no /proc/self/status on this system")
def test_peak_rss_sees_a_tensor_and_resets():
    # Freed heap memory of earlier tests in this process stays resident and a new tensor may reuse it without
    # growing RSS: hand it back first, so the tensor's pages are faulted in anew.
    measure.trim_heap()
    if not measure.reset_peak_rss():
        pytest.skip("this kernel does not allow resetting VmHWM via /proc/self/clear_refs")
    before = measure.peak_rss_bytes()
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    grown = measure.peak_rss_bytes()
    assert grown - before >= 60 * 2**20
    del block
    measure.trim_heap()  # the block may have come from the heap, which keeps freed pages resident
    measure.reset_peak_rss()
    assert measure.peak_rss_bytes() < grown - 30 * 2**20


def test_cuda_peaks_are_none_off_cuda():
    assert measure.cuda_peaks(torch.device("cpu")) == (None, None)


def test_step_timer_on_cpu_reads_intervals_between_marks():
    timer = measure.StepTimer(torch.device("cpu"))
    timer.mark("a")
    sum(range(100_000))
    timer.mark("b")
    timer.mark("c")
    assert timer.seconds("a", "b") > 0 and timer.seconds("a", "c") >= timer.seconds("a", "b")


def test_step_seconds_adds_the_three_timed_intervals_and_leaves_the_gaps_out():
    timer = measure.StepTimer(torch.device("cpu"))
    timer.marks = dict(zip(STEP_MARKS, [0.0, 2.0, 7.0, 8.5, 20.0, 20.5], strict=True))  # gaps: probes, RSS
    assert timer.step_seconds() == (2.0 + 1.5 + 0.5, 1.5)


def test_stream_bandwidth_on_cpu_is_one_rate_per_pass(monkeypatch):
    monkeypatch.setattr(stream, "last_level_cache_bytes", lambda: 2 * 2**20)  # 2 MiB operands: quick
    rates = stream.stream_bandwidth_samples(torch.device("cpu"), samples=3)
    assert len(rates) == 3 and min(rates) > 1e8  # any memory system moves more than 100 MB/s


class _SecondTimer:
    """A StepTimer whose every interval lasts one second: a rate is then the bytes a pass is counted to move."""

    def __init__(self, device):
        pass

    def mark(self, name):
        pass

    def seconds(self, start, end):
        return 1.0


def test_a_stream_pass_counts_the_bytes_an_adamw_step_moves(monkeypatch):
    """Four operands (weights, gradients, two moments): weights and moments read and written, gradients read: 7 x
    the operand, as optimizers/base.py counts a step's traffic (3 x weights + 2 x state)."""
    monkeypatch.setattr(stream, "StepTimer", _SecondTimer)
    assert stream.stream_bandwidth_samples(torch.device("cpu"), samples=2, operand_bytes=2**20) == [7 * 2**20] * 2


def test_cuda_bandwidth_buffer_is_large_but_never_the_trials_oom():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert stream.bandwidth_buffer_bytes(cuda) == 512 * 2**20  # events time a pass of this well
    assert stream.bandwidth_buffer_bytes(cuda, room_bytes=80 * 2**30) == 512 * 2**20
    assert stream.bandwidth_buffer_bytes(cuda, room_bytes=400 * 2**20) == 80 * 2**20  # four operands and a spare
    assert stream.bandwidth_buffer_bytes(cpu, room_bytes=1) == stream.last_level_cache_bytes()


class _FakeDevice:
    """A device whose step only queues work: `step()` returns at once and the work ends `work_s` later; only a
    synchronize moves the host clock past the queued work (what CUDA does to a host timer)."""

    def __init__(self):
        self.now = self.busy_until = 0.0
        self.synced: list[object] = []

    def queue(self, work_s):
        self.busy_until = max(self.now, self.busy_until) + work_s

    def synchronize(self, device):
        self.synced.append(device)
        self.now = max(self.now, self.busy_until)


def test_injected_slowdown_is_proportional_to_the_steps_device_time(monkeypatch):
    device, slept = _FakeDevice(), []
    monkeypatch.setattr(timing, "synchronize", device.synchronize)
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: device.now))  # the clock
    monkeypatch.setattr(slowdown, "busy_wait", slept.append)  # the knob's wait
    monkeypatch.setenv(slowdown.SLOWDOWN_ENV, "0.5")
    param = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([param], lr=0.1)
    for work_s in (0.2, 0.8):
        optimizer.step = lambda work_s=work_s: device.queue(work_s)  # a launch-only step
        slowdown.slow_down_if_asked(optimizer)
        device.queue(3.0)  # backward work still queued when step() is called: not the step's
        optimizer.step()
    assert slept == [pytest.approx(0.1), pytest.approx(0.4)]  # 0.5 x each step's device time, not its launch (0)
    assert device.synced == [param.device] * 4  # before and after each step, on the parameters' device


def test_slowdown_knob_is_off_unless_set_and_slows_step_when_set(monkeypatch):
    param = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([param], lr=0.1)
    original = optimizer.step
    monkeypatch.delenv(slowdown.SLOWDOWN_ENV, raising=False)
    slowdown.slow_down_if_asked(optimizer)
    assert optimizer.step == original  # untouched: no cost in real runs
    monkeypatch.setenv(slowdown.SLOWDOWN_ENV, "1.0")
    slept = []
    monkeypatch.setattr(slowdown, "busy_wait", slept.append)
    slowdown.slow_down_if_asked(optimizer)
    param.grad = torch.ones(4)
    optimizer.step()
    assert len(slept) == 1 and slept[0] > 0 and torch.allclose(param.detach(), torch.full((4,), 0.9))


def test_the_knob_holds_the_core_until_its_mark_and_never_sleeps(monkeypatch):
    """A sleep hands the core away and comes back late to a cooler machine (docs/benchmarks.md); the knob spins."""
    ticks = iter(range(100))
    monkeypatch.setattr(slowdown, "time", SimpleNamespace(perf_counter=lambda: next(ticks) * 0.001,
                                                        sleep=lambda s: pytest.fail("the knob slept")))
    slowdown.busy_wait(0.0105)
    assert next(ticks) == 12  # the mark read at tick 0, then the clock until past 0.0105 s (tick 11), then done


@pytest.mark.skipif(measure.peak_rss_bytes() is None or not measure.reset_peak_rss(),
                    reason="VmHWM cannot be read or reset here (/proc/self/status, /proc/self/clear_refs)")
def test_work_inside_a_pause_is_not_the_windows_peak():
    """What `--eval-every` evaluations and the resume check's checkpoint run under: an LM evaluation's fp32 logits
    can outgrow training, and must not be reported as the training peak."""
    window = measure.MemoryWindow(torch.device("cpu"))
    kept = torch.ones(16 * 2**20 // 4)  # 16 MiB of "training"
    with window.paused():
        evaluation = torch.ones(192 * 2**20 // 4)  # 192 MiB, freed before the pause ends
        del evaluation
    record = Record()
    window.fill(record)
    assert 12 * 2**20 < record.peak_rss_growth_bytes < 100 * 2**20
    del kept


def test_device_used_memory_is_sampled_over_the_window_without_what_pauses_cached(monkeypatch):
    """Paged optimizer state (cudaMallocManaged) is invisible to torch's allocator: the window follows the
    driver's used-memory count instead. A fake driver count stands in for torch.cuda.mem_get_info here."""
    readings = iter([1000,  # the window opens
                     1600,  # after step 0: grads, paged state
                     1600, 1900,  # a pause: sampled before, then 300 left cached by the evaluation
                     2000,  # after step 1: 100 more of training
                     2000])  # fill's last reading
    monkeypatch.setattr(measure, "device_used_bytes", lambda device: next(readings))
    window = measure.MemoryWindow(torch.device("cpu"))
    window.sample_device_used()
    with window.paused():
        pass
    window.sample_device_used()
    record = Record()
    window.fill(record)
    assert record.peak_device_used_growth_bytes == 2000 - 300 - 1000
    assert next(readings, None) is None  # every reading the window was expected to take, and no more


def test_device_used_bytes_and_paged_state_off_cuda():
    assert measure.device_used_bytes(torch.device("cpu")) is None
    paged = torch.zeros(1000)
    paged.is_paged = True  # bitsandbytes marks its cudaMallocManaged buffers so (functional.get_paged)
    shared_qmap = torch.zeros(256)
    state = {0: {"state1": paged, "qmap1": shared_qmap}, 1: {"state1": torch.zeros(10), "qmap1": shared_qmap}}
    assert measure.paged_state_bytes(_FakeOptimizer(state)) == 4000
    assert measure.paged_state_bytes(_FakeOptimizer({0: {"exp_avg": torch.zeros(8)}})) == 0


def test_a_slowed_optimizer_still_takes_an_lr_schedule_in_either_order(monkeypatch):
    from optbench.trial.schedules import make_scheduler

    monkeypatch.setenv(slowdown.SLOWDOWN_ENV, "0.5")
    slept = []
    monkeypatch.setattr(slowdown, "busy_wait", slept.append)
    for schedule_first in (False, True):  # the trial slows first; a parallel mode's rebuilt optimizer after
        param = torch.nn.Parameter(torch.ones(4))
        optimizer = torch.optim.SGD([param], lr=0.1)
        scheduler = make_scheduler(optimizer, "linear", 4, 1) if schedule_first else None
        slowdown.slow_down_if_asked(optimizer)
        scheduler = scheduler or make_scheduler(optimizer, "linear", 4, 1)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. "lr_scheduler.step() before optimizer.step()"
            for _ in range(2):
                param.grad = torch.ones(4)
                optimizer.step()
                scheduler.step()
    assert len(slept) == 4


def test_a_peak_rss_that_cannot_be_reset_is_said_not_silently_recorded(monkeypatch, tmp_path):
    """Where the kernel refuses the reset, VmHWM holds the whole process's peak (imports, setup): a warning says
    so instead of a growth figure passing for the training window's."""
    monkeypatch.setattr(measure, "_CLEAR_REFS", tmp_path / "no-such-folder" / "clear_refs")
    with pytest.warns(measure.MeasurementWarning, match="peak RSS could not be reset"):
        measure.MemoryWindow(torch.device("cpu"))


def test_a_guessed_cache_size_is_said(monkeypatch, tmp_path):
    monkeypatch.setattr(stream, "_CPU_CACHE", tmp_path)  # a sysfs folder without cache entries
    with pytest.warns(measure.MeasurementWarning, match="assumes a 32 MiB last-level cache"):
        assert stream.last_level_cache_bytes() == stream.GUESSED_CACHE_BYTES


def test_the_slowdown_knob_reaches_production_code_through_one_seam():
    """OPTBENCH_TEST_OPTIMIZER_SLOWDOWN is a test-only knob: one module holds it, and the package calls it from
    one place only (Setup.install_optimizer), where every trial's optimizer is made."""
    import ast
    from pathlib import Path

    package = Path(measure.__file__).resolve().parents[1]
    callers = set()
    for path in package.rglob("*.py"):
        text = path.read_text()
        if path.name == "slowdown.py":
            continue
        assert slowdown.SLOWDOWN_ENV not in text, f"{path} reads the knob itself"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                    "slow_down_if_asked", "injected_slowdown"):
                callers.add(str(path.relative_to(package)))
    assert callers == {"trial/engines/base.py"}
