"""Sweep planning: presets and the grid of trials. Pure data, no torch, so `plan` is instant and testable.

The presets and study designs live in presets.toml beside this module (a committed file, each number with why).

A `TrialSpec` holds every setting that changes what a trial measures; its `trial_id` is a stable hash
of those settings, which is how a re-run recognises (and skips) trials already recorded `ok`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class Preset:
    workload: str
    steps: int
    warmup_steps: int  # excluded from the timing medians; also the learning-rate warm-up length
    batch_size: int
    seq_len: int
    eval_size: int
    seeds: tuple[int, ...]
    timeout_s: float
    optimizers: tuple[str, ...] = ()  # what a sweep of it compares; empty: the registry's default three


@dataclass(frozen=True)
class StudyBudget:
    """What `study` adds to a preset: the lr grid size, the tune seeds, the final seeds and the eval-curve interval.

    The tune stage runs each optimizer's grid over `tune_seeds` on the finals' own job (same steps and schedule:
    a shorter tune run favours large lrs), scored on a validation split carved from the training rows; the tune
    trial at the chosen lr *is* that seed's final, so the final stage only adds the other `seeds`.
    """

    lr_points: int
    eval_every: int
    tune_seeds: tuple[int, ...] = (0,)
    seeds: tuple[int, ...] = (0, 1, 2)
    search: str = "walk"  # "walk" from the default lr (study.next_on_walk) or "grid": every point at once
    jobs: int = 1  # trials at once when --jobs is not given (local executor only; a GPU each on CUDA)


PRESETS_FILE = Path(__file__).with_name("presets.toml")


def _tables(kind: str, cls: type) -> dict[str, Any]:
    """The file's [KIND.NAME] tables as `cls` instances; `based_on` copies another table of the kind first."""
    with PRESETS_FILE.open("rb") as handle:
        raw = tomllib.load(handle)[kind]

    def resolved(name: str) -> dict[str, Any]:
        table = dict(raw[name])
        base = table.pop("based_on", None)
        return {**(resolved(base) if base else {}), **table}

    return {name: cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in resolved(name).items()})
            for name in raw}


PRESETS: dict[str, Preset] = _tables("preset", Preset)
STUDY_BUDGETS: dict[str, StudyBudget] = _tables("study", StudyBudget)


PRECISIONS = ("fp32", "bf16-autocast", "fp16-autocast", "bf16")  # see optbench/trial/precision.py
SCHEDULES = ("linear", "constant", "cosine", "wsd")  # see optbench/trial/schedules.py; linear is HF Trainer's default
_NOT_IN_ID = ("timeout_s", "max_memory_bytes", "state_map_dir", "lr_source")
_LATER_FIELDS = ("stage", "val_fraction", "precision", "eval_every", "target", "engine", "parallel", "nproc",
                 "workload_options", "resume_check", "dataset_sha256", "paired_probe", "threads")


PARALLEL_MODES = ("ddp", "zero1", "fsdp2")  # --parallel: the native loop under torchrun (trial/engines/parallel.py)
PARALLEL_NPROC = 2  # the ranks a --parallel mode runs without --nproc (run, study and explain)


@dataclass(frozen=True)
class TrialSpec:
    optimizer: str
    workload: str = "minilm"
    model: str | None = None  # HF id or local path overriding the workload's model
    dataset: str | None = None  # HF `name[:config]` or a local csv/json/parquet file
    text_column: str = "text"
    label_column: str = "label"
    seed: int = 0
    device: str = "auto"
    steps: int = 100
    warmup_steps: int = 10
    batch_size: int = 16
    seq_len: int = 32
    eval_size: int = 512
    lr: float | None = None  # None: the registry's default learning rate for this optimizer
    # where `lr` came from (tuned: <study file> | registry default | user | study: ...); not in trial_id: the lr is
    lr_source: str | None = None
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)
    fidelity: bool = False  # also run a shadow fp32 AdamW and record update cosine / relative error
    timeout_s: float = 900.0
    # Added after schema 1: left out of trial_id while at their defaults, so older results still resume.
    stage: str | None = None  # study trials ("tune" | "final") hold out a validation split; None: a plain run
    val_fraction: float = 0.1  # share of the training rows held out as the validation split (tune stage)
    precision: str = "fp32"  # fp32 | bf16-autocast | fp16-autocast | bf16
    eval_every: int = 0  # evaluate a fixed eval subset every K steps (outside the timed intervals); 0: never
    target: float | None = None  # time-to-target threshold on the workload's target metric
    engine: str = "native"  # native | trainer | accelerate
    parallel: str = "none"  # "none" or one of PARALLEL_MODES
    nproc: int = 1  # processes (ranks) for a parallel mode
    max_memory_bytes: int | None = None  # cap on the trial child's address space (RLIMIT_AS); not in trial_id
    # Schema 2. `schedule` is always in the id: schema-1 trials ran at a constant lr and must not pass for these.
    schedule: str = "linear"  # lr after the warm-up: linear decay to 0 (HF Trainer's default), constant, cosine, wsd
    workload_options: dict[str, Any] = field(default_factory=dict)  # the workload's parameters, e.g. hidden_size
    resume_check: bool = False  # save at the middle step, resume in fresh objects, compare (optbench/resume.py)
    state_map_dir: str | None = None  # write the measured per-parameter state map (CSV) here; not in trial_id
    # What a trial trains on. Every trial now leaves the validation rows out of training (a run trains as a study's
    # trial does); always in trial_id, so no trial recorded when runs trained on every row passes for one of these.
    train_rows: str = "without-val"
    # A local dataset file's content (planner.dataset_fingerprint): the file edited under the same name is another
    # trial, never one "already ok" from the rows it held before. None: the embedded data or an HF dataset name.
    dataset_sha256: str | None = None
    paired_probe: bool = False  # time the stream kernel after every optimizer step (optbench/probes/paired.py)
    # torch's CPU threads in the trial (--threads); None: torch's own count, or the --jobs share. In trial_id when
    # set: a step's time depends on it, so a trial at one count never passes for one at another.
    threads: int | None = None

    @property
    def trial_id(self) -> str:
        """Stable hash of the settings that change the measurement (timeout and memory cap do not)."""
        defaults = {f.name: f.default for f in dataclasses.fields(self) if f.name in _LATER_FIELDS}
        data = {k: v for k, v in self.to_dict().items()
                if k not in _NOT_IN_ID and not (k in defaults and v == defaults[k])}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialSpec:
        return cls(**data)


def build_grid(optimizers: list[str], seeds: list[int], **settings: Any) -> list[TrialSpec]:
    """One trial per (seed, optimizer), seeds outermost so an interrupted sweep has every optimizer once."""
    return [TrialSpec(optimizer=name, seed=seed, **settings) for seed in seeds for name in optimizers]
