"""The workload registry: a name → the workload a trial trains (one file per workload beside this one).

Adding a workload is one file defining a `Workload` subclass plus one line in `WORKLOADS`; nothing else
in optbench branches on a workload's name. A workload's parameters (the tiny BERT's `hidden_size`, which
the scaling sweep varies) travel in `TrialSpec.workload_options`, never in its name; `--model` with no
`--workload` is a classification fine-tune of that model. What the memory side needs of a workload (its model on
the meta device, the name a model folder is recorded under) it asks through `Workload.meta_model` and
`model_name_for_source`.

May import: optimizers, job, records.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from optbench.job import tuned
from optbench.workloads.base import (
    OFFLINE_MODEL_HINT,
    Built,
    Split,
    Workload,
    WorkloadError,
    check_model,
    minilm_path,
    model_config,
    on_meta_device,
    train_batches,
)
from optbench.workloads.classify import Classification, tiny_bert_config
from optbench.workloads.lm import CausalLM

if TYPE_CHECKING:
    from optbench.job.spec import TrialSpec
    from optbench.optimizers import OptimizerSpec

__all__ = ["LR_DEFAULT", "LR_TUNED", "LR_UNRESOLVED", "LR_USER", "OFFLINE_MODEL_HINT", "WORKLOADS", "Built", "Split",
           "Workload", "WorkloadError", "check_model", "default_lr", "get_workload", "lr_for", "minilm_path",
           "model_config", "model_name_for_source", "on_meta_device", "tiny_bert_config", "train_batches"]
# Where a trial's lr came from (Record.lr_source): the user's --lr, a committed study's choice, the registry's default,
# or nowhere (a failed trial's record whose optimizer or workload did not resolve: its lr 0.0 is no one's)
LR_USER, LR_TUNED, LR_DEFAULT = "user", "tuned: ", "registry default"
LR_UNRESOLVED = "unresolved: the optimizer or workload is unknown"

WORKLOADS: dict[str, Workload] = {
    "minilm": Classification("minilm", pretrained=True,
                             description="pretrained all-MiniLM-L6-v2 BERT, 3-class review sentiment (default)"),
    "tiny": Classification("tiny", pretrained=False, options={"hidden_size": "hidden width (default 64)"},
                           description="2-layer random-init BERT (tests, the scaling sweep)"),
    "custom": Classification("custom", pretrained=True, description="--model as a sequence classifier",
                             needs_model=True),
    "lm": CausalLM(),
}


def get_workload(name: str) -> Workload:
    """The registered workload. Unknown names list the known ones."""
    if name not in WORKLOADS:
        raise WorkloadError(f"unknown workload '{name}'; known: {', '.join(WORKLOADS)}")
    return WORKLOADS[name]


def default_lr(spec: TrialSpec, entry: OptimizerSpec) -> float:
    """The registry's untuned lr for this job: the entry's fine-tuning lr times the workload's scale for it."""
    return entry.default_lr * get_workload(spec.workload).lr_scale(spec)


def model_name_for_source(source: str) -> str:
    """The name records give the model at `source` (a calibration is keyed by it): a folder a registered workload
    trains by default (the shipped MiniLM) by that workload's name for it; any other source as a `--model` run
    records it, by its source."""
    from pathlib import Path

    from optbench.job.spec import TrialSpec

    for workload in WORKLOADS.values():
        spec = TrialSpec(optimizer="adamw", workload=workload.name)
        try:
            default = workload.model_source(spec)
        except WorkloadError:  # its model's package is not installed here
            continue
        if default is not None and Path(default).resolve() == Path(source).resolve():
            return workload.model_name(spec)
    return source


def lr_for(spec: TrialSpec, entry: OptimizerSpec, table: Path | None = None) -> tuple[float, str]:
    """(lr, where it came from) for a trial: `spec.lr` (the user's, or a study's), else the lr a committed study
    tuned for this job and optimizer (`table`, default the shipped job/tuned-lrs.json), else the registry's untuned
    default."""
    if spec.lr:
        return spec.lr, spec.lr_source or LR_USER
    workload = get_workload(spec.workload)
    job = {"workload": spec.workload, "workload_options": spec.workload_options, "model": workload.model_name(spec),
           "pretrained": workload.is_pretrained(spec), "dataset": workload.dataset_name(spec), "steps": spec.steps,
           "warmup_steps": spec.warmup_steps, "batch_size": spec.batch_size, "seq_len": spec.seq_len,
           "schedule": spec.schedule, "precision": spec.precision}
    found = tuned.lookup(job, entry.name, table or tuned.TABLE)
    if found is not None:
        return found.lr, f"{LR_TUNED}{found.source}"
    return default_lr(spec, entry), LR_DEFAULT
