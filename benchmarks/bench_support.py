"""What the benchmark modules share: suite sizes, a fresh model per benchmark, memory readings, extra_info.

The benchmarks measure with optbench's own pieces (registry, workload, probes, trial, Record), so a
number here means what the same-named field means in a results file. `extra_info` therefore holds
Record fields by their Record names, plus `kind`; optbench.records.benchjson turns it back into Records.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from optbench.job.spec import PRESETS, TrialSpec
from optbench.optimizers import OptimizerSpec
from optbench.probes import bandwidth, measure
from optbench.records.environment import machine_key
from optbench.records.record import Record
from optbench.trial.describe import describe_model, describe_state
from optbench.trial.engines.loop import warm_up
from optbench.trial.run import bandwidth_probe, device_name, setup
from optbench.trial.settings import settings_record
from optbench.workloads import train_batches
from optbench.workloads.base import take, to_device

if TYPE_CHECKING:
    from optbench.workloads import Built

# Record fields left out of extra_info: the loss curve is long and the environment goes to machine_info.
_NOT_IN_EXTRA_INFO = ("loss_curve", "env")


@dataclass(frozen=True)
class BenchSize:
    """How big each benchmark is for one `--optbench-preset`."""

    preset: str
    workload: str
    batch_size: int
    seq_len: int
    step_rounds: int  # timed rounds of optimizer.step() alone
    train_rounds: int  # timed rounds of a whole train step
    warmup_rounds: int  # untimed rounds first: the first step() creates the state lazily
    finetune_steps: int  # the short fine-tune (run_trial) whose accuracy lands in extra_info
    finetune_warmup_steps: int
    eval_size: int
    overhead_steps: int  # steps per run in the harness-vs-bare comparison
    overhead_warmup_steps: int
    overhead_min_pairs: int  # (bare, harness) pairs of runs, interleaved in ABBA order, before the interval is read
    overhead_max_pairs: int  # pairs at most: the interval still straddling the tolerance then, it is unmeasured
    overhead_tolerance: float  # |harness / bare - 1| allowed


def _size(name: str, workload: str | None = None, batch_size: int | None = None, **rest: Any) -> BenchSize:
    """Batch and sequence length come from the `optbench run` preset of the same name (`batch_size` overrides)."""
    preset = PRESETS[name]
    return BenchSize(preset=name, workload=workload or preset.workload, batch_size=batch_size or preset.batch_size,
                     seq_len=preset.seq_len, **rest)


SIZES: dict[str, BenchSize] = {
    # CI: the tiny random BERT, a handful of rounds; it proves every path runs, its numbers mean little.
    # Its ~20 ms steps shift by 20 % from run to run when a neighbour takes a core, so its harness check
    # only catches gross overhead (a stray sync, a per-step write); the 3 % target is default's and nightly's.
    "smoke": _size("smoke", workload="tiny", step_rounds=5, train_rounds=5, warmup_rounds=2, finetune_steps=8,
                   finetune_warmup_steps=2, eval_size=64, overhead_steps=40, overhead_warmup_steps=5,
                   overhead_min_pairs=3, overhead_max_pairs=6, overhead_tolerance=0.25),
    # The MiniLM model and sequence of `optbench run` at batch 16 (run's job is batch 64 x 60 steps since the study
    # was redesigned for power; the benchmarks keep batch 16, so their step times compare with every earlier record
    # and the default suite stays inside its 15 minutes), sized to finish in about 4 minutes on 2 CPU cores: a
    # 30-step fine-tune (accuracy is lower than the run preset's); the harness check adds 3 to 10 minutes.
    "default": _size("default", batch_size=16, step_rounds=5, train_rounds=3, warmup_rounds=1, finetune_steps=30,
                     finetune_warmup_steps=5, eval_size=256, overhead_steps=20, overhead_warmup_steps=4,
                     overhead_min_pairs=6, overhead_max_pairs=20, overhead_tolerance=0.03),
    # GPUs: the nightly preset's job (batch 32, seq 64, 400 steps) and enough rounds for stable medians.
    "nightly": _size("nightly", step_rounds=50, train_rounds=30, warmup_rounds=5, finetune_steps=400,
                     finetune_warmup_steps=40, eval_size=1000, overhead_steps=200, overhead_warmup_steps=20,
                     overhead_min_pairs=4, overhead_max_pairs=12, overhead_tolerance=0.03),
}


def suite_device(name: str) -> torch.device:
    """The device `name` (auto, cpu, cuda, cuda:N) means for the suite, with its index, made the current device:
    `cuda` and `auto` are the current GPU, and a `cuda:N` suite must time on GPU N's stream, not GPU 0's (CUDA
    events, `torch.cuda.synchronize()` and libraries that say "cuda" all follow the current device). The names
    `job.devices.resolve_device` refuses are refused (ValueError)."""
    from optbench.job.devices import resolve_device

    device = resolve_device(name)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)
    return device


def trial_spec(size: BenchSize, optimizer: str, device: torch.device, **overrides: Any) -> TrialSpec:
    """The job every benchmark of one optimizer belongs to (same spec, same trial_id, one report row)."""
    settings: dict[str, Any] = dict(workload=size.workload, device=str(device), steps=size.finetune_steps,
                                    warmup_steps=size.finetune_warmup_steps, batch_size=size.batch_size,
                                    seq_len=size.seq_len, eval_size=size.eval_size)
    return TrialSpec(optimizer=optimizer, **(settings | overrides))


def fresh_model(built: Built, device: torch.device) -> torch.nn.Module:
    """A copy of the session's model, so one benchmark's updates never leak into the next one's."""
    model = copy.deepcopy(built.model).to(device)
    model.train()
    return model


def first_batch(built: Built, batch_size: int, device: torch.device) -> dict[str, torch.Tensor]:
    return to_device(take(built.train, slice(0, batch_size)), device)


def measured_record(spec: TrialSpec, optimizer_spec: OptimizerSpec, built: Built, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, device: torch.device, memory: measure.MemoryWindow) -> Record:
    """The job's Record filled the way a trial fills it: model size, analytic and measured state, peaks."""
    record = settings_record(spec)
    record.status = "ok"
    record.device, record.device_name = str(device), device_name(device)
    record.model, record.dataset = built.model_name, built.dataset_name
    describe_model(record, model, optimizer_spec)
    describe_state(record, optimizer, optimizer_spec)  # paged state too: outside the CUDA allocator's peak
    memory.fill(record)
    return record


def extra_info(kind: str, record: Record) -> dict[str, Any]:
    """The benchmark's extra_info: `kind` plus the Record's fields under their Record names."""
    data = {k: v for k, v in record.to_dict().items() if k not in _NOT_IN_EXTRA_INFO}
    return {"kind": kind, **data}


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
               device: torch.device) -> None:
    """One whole step as every fine-tuning loop does it, finished on the device before returning."""
    model(**batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    measure.synchronize(device)


def trial_probe(s: Any, device: torch.device) -> list[float]:
    """The trial's own bandwidth probe (trial/run.bandwidth_probe): the same calibration, the same working set."""
    record = settings_record(s.spec)
    describe_model(record, s.model, s.entry)
    return bandwidth_probe(s, record, bandwidth.load_for(machine_key(device))[0])


# What a trial does between its setup and its first timed step, in its order: the bandwidth probe (large buffers
# allocated, freed, the heap trimmed), one warm-up forward/backward, the memory window's collection and heap trim.
HARNESS_PREAMBLE: dict[str, Callable[[Any, torch.device], object]] = {
    "bandwidth probe": lambda s, device: trial_probe(s, device),
    "warm-up pass": lambda s, device: warm_up(s),
    "heap trim": lambda s, device: measure.release_freed_memory(),
}


def bare_step_median_s(spec: TrialSpec, device: torch.device, preamble: tuple[str, ...] = tuple(HARNESS_PREAMBLE)
                       ) -> float:
    """The job without the harness: the trial's own setup, the named parts of its preamble, then a bare loop over the
    same batches, each moved to the device as the harness does; the median step over the steps the harness's
    median covers. Each step ends synchronized, as the harness's step does."""
    s = setup(spec, settings_record(spec))
    for part in preamble:
        HARNESS_PREAMBLE[part](s, device)
    times = []
    for cpu_batch in train_batches(s.built.train, spec.batch_size, spec.steps, spec.seed):
        batch = to_device(cpu_batch, device)
        start = measure.clock(device)
        train_step(s.model, s.optimizer, batch, device)
        s.scheduler.step()
        times.append(measure.clock(device) - start)
    # The harness keeps step 0 (state creation) and the warm-up steps out of its median; so does this.
    return statistics.median(times[max(1, spec.warmup_steps):])
