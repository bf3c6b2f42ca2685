"""The workload registry: a name → the workload a trial trains (one file per workload beside this one).

Adding a workload is one file defining a `Workload` subclass plus one line in `WORKLOADS`; nothing else
in optbench branches on a workload's name. A workload's parameters (the tiny BERT's `hidden_size`, which
the scaling sweep varies) travel in `TrialSpec.workload_options`, never in its name; `--model` with no
`--workload` is a classification fine-tune of that model.

May import: optimizers, job, records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from optbench.workloads.base import (
    OFFLINE_MODEL_HINT,
    Built,
    Split,
    Workload,
    WorkloadError,
    check_model,
    minilm_path,
    train_batches,
)
from optbench.workloads.classify import Classification, tiny_bert_config
from optbench.workloads.lm import CausalLM

if TYPE_CHECKING:
    from optbench.job.spec import TrialSpec
    from optbench.optimizers import OptimizerSpec

__all__ = ["OFFLINE_MODEL_HINT", "WORKLOADS", "Built", "Split", "Workload", "WorkloadError", "check_model",
           "default_lr", "get_workload", "minilm_path", "tiny_bert_config", "train_batches"]

WORKLOADS: dict[str, Workload] = {
    "minilm": Classification("minilm", pretrained=True,
                             description="pretrained all-MiniLM-L6-v2 BERT, 3-class review sentiment (default)"),
    "tiny": Classification("tiny", pretrained=False, options={"hidden_size": "hidden width (default 64)"},
                           description="2-layer random-init BERT (tests, the scaling sweep)"),
    "custom": Classification("custom", pretrained=True, description="--model as a sequence classifier"),
    "lm": CausalLM(),
}


def get_workload(name: str) -> Workload:
    """The registered workload. Unknown names list the known ones."""
    if name not in WORKLOADS:
        raise WorkloadError(f"unknown workload '{name}'; known: {', '.join(WORKLOADS)}")
    return WORKLOADS[name]


def default_lr(spec: TrialSpec, entry: OptimizerSpec) -> float:
    """The lr a trial uses without `--lr`: the entry's fine-tuning lr times the workload's scale for it."""
    return entry.default_lr * get_workload(spec.workload).lr_scale(spec)
