"""One settings builder for `run`, `study` and `nightly`: job flags + a preset -> the trials to run.

The command line hands over its parsed job flags (`JOB_FLAGS` names every one; a flag left unset is None and the
preset decides); this module resolves optimizer names and aliases, applies the one availability policy (an
optimizer that cannot run here gets a `skipped` record with the reason, the rest run), checks the combinations
that cannot work, and builds `TrialSpec`s. Pure data, no torch: planning is instant and testable, and
`__main__.py` only parses, calls and prints.
"""

from __future__ import annotations

import dataclasses
import hashlib
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optbench import optimizers
from optbench.job.spec import PARALLEL_NPROC, PRESETS, STUDY_BUDGETS, Preset, StudyBudget, TrialSpec, build_grid

# Every flag that defines the job or where it runs, by its argparse destination. run, study and nightly all take
# them (options.add_job_arguments); a test walks run's parser against this list.
JOB_FLAGS = ("workload", "workload_option", "model", "dataset", "text_column", "label_column", "steps", "warmup_steps",
             "batch_size", "seq_len", "eval_size", "eval_every", "target", "lr", "schedule", "precision", "engine",
             "parallel", "nproc", "device", "timeout", "max_memory", "optimizer_kwargs", "fidelity", "resume_check",
             "paired_probe", "threads", "jobs", "executor", "slurm_partition", "slurm_time", "gpus_per_trial",
             "slurm_account", "slurm_max_running", "slurm_pending_timeout", "slurm_option")


class PlanError(ValueError):
    """Settings that cannot make a job; the message is the one line the user sees (exit 2)."""


@dataclass(frozen=True)
class Plan:
    """The trials to run, and the ones that cannot run here (each with why): those are recorded `skipped`."""

    specs: list[TrialSpec]
    unavailable: list[tuple[TrialSpec, str]]


def once_each(values: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """(the values in order with each repeat dropped, the values that were repeated): a seed, an lr or an optimizer
    given twice would record one trial twice and count it twice in an interval, so it runs once and is said."""
    kept = list(dict.fromkeys(values))
    return kept, [value for value in kept if values.count(value) > 1]


def resolve_names(names: Sequence[str] | None, preset: Preset | None = None) -> list[str]:
    """Registry names for `names` (aliases folded, duplicates dropped, order kept); `all`: every available entry;
    None: the preset's optimizers, or the registry's default three."""
    if names is None:
        names = (preset.optimizers if preset else ()) or optimizers.DEFAULT_OPTIMIZERS
    if [n.lower() for n in names] == ["all"]:
        names = optimizers.available_names()
    try:
        given = [optimizers.resolve(name).name for name in names]
    except optimizers.UnknownOptimizerError as exc:
        raise PlanError(str(exc)) from None
    resolved, repeated = once_each(given)
    if repeated:
        warnings.warn(f"--optimizers names {', '.join(repeated)} more than once (an alias counts as its entry): each "
                      "runs once", stacklevel=2)
    if not resolved:
        raise PlanError("--optimizers is empty")
    return resolved


def optimizer_kwargs(items: Sequence[str], names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """`--optimizer-kwargs NAME=JSON` items for optimizers the job runs."""
    try:
        parsed = optimizers.parse_optimizer_kwargs(items)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    stray = sorted(set(parsed) - set(names))
    if stray:
        raise PlanError(f"--optimizer-kwargs for {', '.join(stray)}, which --optimizers does not run")
    for name, kwargs in parsed.items():
        refusal = optimizers.kwargs_refusal(name, kwargs)
        if refusal:
            raise PlanError(refusal)
    return parsed


def workload_options(items: Sequence[str] | None) -> dict[str, Any]:
    """`--workload-option KEY=VALUE` items; integer values become ints (e.g. hidden_size=128)."""
    options: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise PlanError(f"--workload-option expects KEY=VALUE, e.g. hidden_size=128; got '{item}'")
        options[key.strip()] = _int_or_text(value.strip())
    return options


def _int_or_text(value: str) -> int | str:
    """An integer where int() reads one (`128`, `-1`), else the text as given: `--5` or `²` pass str.isdigit's test
    and made int() raise, a traceback where a workload's own check would say what it expects."""
    try:
        return int(value)
    except ValueError:
        return value


def _parallel(flags: Mapping[str, Any]) -> dict[str, Any]:
    """engine, parallel and nproc; a parallel mode runs the native loop under torchrun on GPUs 0..N-1."""
    mode, nproc, engine = flags.get("parallel") or "none", flags.get("nproc"), flags.get("engine") or "native"
    if flags.get("paired_probe") and (engine != "native" or mode != "none"):
        raise PlanError("--paired-probe times its pass in the native loop of one process; drop --engine / --parallel")
    if flags.get("resume_check") and engine not in ("native", "trainer"):
        raise PlanError(f"--resume-check runs with the native loop (and its --parallel modes) or Trainer; "
                        f"drop --engine {engine}")
    if mode == "none":
        if nproc not in (None, 1):
            raise PlanError("--nproc needs a --parallel mode (ddp, zero1 or fsdp2)")
        return {"engine": engine}
    if engine != "native":
        raise PlanError(f"--parallel {mode} trains with the native loop; drop --engine {engine}")
    if flags.get("fidelity"):
        raise PlanError("--fidelity is single-process only; drop it or --parallel")
    if ":" in str(flags.get("device") or ""):
        raise PlanError(f"--parallel {mode} gives rank i the i-th visible GPU; use --device cuda (and "
                        "CUDA_VISIBLE_DEVICES to choose the GPUs), not a device index")
    # --nproc 1 is a one-rank group: the torchrun, collective and checkpoint path on a one-GPU machine.
    return {"engine": "native", "parallel": mode, "nproc": nproc or PARALLEL_NPROC}


def dataset_fingerprint(dataset: str | None) -> str | None:
    """The SHA-256 of a local dataset file's bytes; None for no file (the embedded data, an HF dataset name)."""
    if not dataset or not Path(dataset).is_file():
        return None
    with open(dataset, "rb") as data:
        return hashlib.file_digest(data, "sha256").hexdigest()


def job_settings(flags: Mapping[str, Any], preset: Preset) -> dict[str, Any]:
    """TrialSpec settings (all but optimizer, seed and stage) from the job flags, the preset filling the gaps."""
    steps = flags.get("steps") or preset.steps
    warmup = flags.get("warmup_steps")
    warmup = min(preset.warmup_steps, steps // 2) if warmup is None else warmup
    if not 0 <= warmup < steps:
        raise PlanError(f"--warmup-steps must be in [0, steps), got {warmup} with {steps} steps")
    if flags.get("resume_check") and steps < 2:  # one step has no second half to resume into
        raise PlanError(f"--resume-check saves at the middle step and trains the rest from the checkpoint: it needs "
                        f"--steps 2 or more, got {steps}")
    eval_every = flags.get("eval_every") or 0
    if eval_every > steps:
        warnings.warn(f"--eval-every {eval_every} is more than the {steps} steps: the curve is evaluated at step "
                      f"{steps} only", stacklevel=2)
    model = flags.get("model")
    settings = dict(
        workload=flags.get("workload") or ("custom" if model else preset.workload), model=model,
        workload_options=workload_options(flags.get("workload_option")), dataset=flags.get("dataset"),
        dataset_sha256=dataset_fingerprint(flags.get("dataset")),
        text_column=flags.get("text_column") or "text", label_column=flags.get("label_column") or "label",
        device=flags.get("device") or "auto", steps=steps, warmup_steps=warmup,
        batch_size=flags.get("batch_size") or preset.batch_size, seq_len=flags.get("seq_len") or preset.seq_len,
        eval_size=flags.get("eval_size") or preset.eval_size, lr=flags.get("lr"),
        timeout_s=flags.get("timeout") or preset.timeout_s, fidelity=bool(flags.get("fidelity")),
        paired_probe=bool(flags.get("paired_probe")), threads=flags.get("threads"),
        precision=flags.get("precision") or "fp32", schedule=flags.get("schedule") or "linear",
        eval_every=min(eval_every, steps), target=flags.get("target"),
        max_memory_bytes=flags.get("max_memory"), resume_check=bool(flags.get("resume_check")),
        state_map_dir=flags.get("state_map_dir"), **_parallel(flags),
    )
    return settings


def plan_run(flags: Mapping[str, Any], preset: Preset, names: Sequence[str] | None,
             seeds: Sequence[int] | None) -> Plan:
    """`run`: every optimizer x seed of one job."""
    names = resolve_names(names, preset)
    kwargs = optimizer_kwargs(flags.get("optimizer_kwargs") or (), names)
    if seeds is not None and not seeds:
        raise PlanError("--seeds is empty")
    specs = [dataclasses.replace(spec, optimizer_kwargs=kwargs.get(spec.optimizer, {}))
             for spec in build_grid(names, list(seeds or preset.seeds), **job_settings(flags, preset))]
    return split_unavailable(specs)


def split_unavailable(specs: Sequence[TrialSpec]) -> Plan:
    """The one availability policy: what cannot run here, or not in this job's loop (LOMO outside Trainer, an update
    inside backward under --parallel), is recorded `skipped` with its reason; the rest runs."""
    runnable, unavailable = [], []
    for spec in specs:
        entry = optimizers.resolve(spec.optimizer)
        reason = entry.unavailable_reason() or entry.runs_under(spec.engine, spec.parallel, spec.fidelity)
        if reason is None:
            runnable.append(spec)
        else:
            unavailable.append((spec, reason))
    return Plan(runnable, unavailable)


@dataclass(frozen=True)
class StudyPlan:
    """`study`: the optimizers that can run, the job they share, the budget, and what cannot run here."""

    names: list[str]
    settings: dict[str, Any]  # without lr: the study chooses it
    budget: StudyBudget
    optimizer_kwargs: dict[str, dict[str, Any]]
    unavailable: list[tuple[TrialSpec, str]]
    lr_grid: list[float] | None  # one grid for every optimizer (--lr-grid; --lr is a grid of one); None: registry


def study_budget(preset_name: str, flags: Mapping[str, Any]) -> StudyBudget:
    """The preset's study budget with the study flags (--lr-points, --tune-seeds, --seeds, --tune-search, --jobs)
    applied; under --executor slurm the array, not --jobs, runs trials side by side, so the design's jobs is 1."""
    budget = STUDY_BUDGETS[preset_name]
    changes = {key: tuple(flags[key]) if isinstance(flags.get(key), list) else flags[key]
               for key in ("lr_points", "tune_seeds", "seeds", "jobs") if flags.get(key) is not None}
    if flags.get("executor", "local") != "local" and flags.get("jobs") is None:
        changes["jobs"] = 1
    if flags.get("tune_search"):
        changes["search"] = flags["tune_search"]
    for key in ("tune_seeds", "seeds"):
        if key in changes and not changes[key]:
            raise PlanError(f"--{key.replace('_', '-')} is empty")
    return dataclasses.replace(budget, **changes)


def plan_study(flags: Mapping[str, Any], preset_name: str, names: Sequence[str] | None) -> StudyPlan:
    """`study`: the same job flags as `run`; every study trial evaluates on the eval curve (time to target)."""
    budget = study_budget(preset_name, flags)
    settings = job_settings(flags, PRESETS[preset_name])
    settings["eval_every"] = settings["eval_every"] or min(budget.eval_every, settings["steps"])
    lr = settings.pop("lr")
    if lr and flags.get("lr_grid"):  # the grid won silently, so the lr asked for was never tried
        raise PlanError("--lr and --lr-grid both given: in a study --lr is a grid of one lr; give one of them")
    grid = sorted(flags["lr_grid"]) if flags.get("lr_grid") else [lr] if lr else None
    names = resolve_names(names, PRESETS[preset_name])
    plan = split_unavailable([TrialSpec(optimizer=name, **settings) for name in names])
    runnable = [spec.optimizer for spec in plan.specs]
    return StudyPlan(runnable, settings, budget, optimizer_kwargs(flags.get("optimizer_kwargs") or (), names),
                     plan.unavailable, grid)
