"""Data-parallel training inside one rank of a torchrun group: DDP, ZeRO-1 and FSDP2.

The process layer (optbench/sweep/) launches the group and joins each rank to it; every rank then runs the
ordinary trial (setup, engine, describe, evaluate) with this module's engine, which wraps the model and the
optimizer for the mode and then trains with the native loop:

- ddp:   `DistributedDataParallel` (gradients averaged by all-reduce); every rank holds all of the state.
- zero1: DDP + `ZeroRedundancyOptimizer` around the registry entry's own factory (`entry.build`, so its
         default settings hold): each rank keeps the state of its share of the parameters only.
- fsdp2: `fully_shard` on each block the model names in `_no_split_modules`, then on the root; the
         optimizer is built after sharding, over DTensor parameters, so weights, gradients and state are
         all sharded. An optimizer that cannot take DTensors fails here: the record keeps its message.

Data: each rank trains on its own 1/N of the training rows with batch `batch_size // N` (what a
`DistributedSampler` does), so the global batch is the spec's. Each rank measures its own state bytes
(DTensor state counted by its local shard), peak memory and step times; the process layer gathers them into
`record.per_rank` (rank 0 writes the record). The top-level figures are rank 0's; the loss curve is rank 0's
shard loss.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from optbench.job.spec import PARALLEL_MODES
from optbench.records.peaks import train_memory_bytes
from optbench.records.record import MIB, Record
from optbench.trial.engines.base import EngineResult

if TYPE_CHECKING:
    from optbench.trial.engines.base import Setup


# -- the engine --------------------------------------------------------------------------------------
def prepare(s: Setup, record: Record) -> None:
    """This rank's share of the data and of the batch, the model and optimizer wrapped for the mode: what a rank
    trains with (and what the resume check rebuilds before loading a checkpoint)."""
    import torch.distributed as dist

    from optbench.workloads.base import take

    rank, world = dist.get_rank(), dist.get_world_size()
    s.built = dataclasses.replace(s.built, train=take(s.built.train, slice(rank, None, world)))
    s.spec = dataclasses.replace(s.spec, batch_size=max(1, s.spec.batch_size // world))
    {"ddp": _ddp, "zero1": _zero1, "fsdp2": _fsdp2}[s.spec.parallel](s, record)


def train(s: Setup, record: Record) -> EngineResult:
    """Prepare the rank, train with the native loop, then leave the trial a model it can evaluate and the
    optimizer that holds this rank's state."""
    import torch

    from optbench.trial.engines import native

    spec = s.spec
    prepare(s, record)
    record.per_rank = [{"weights_bytes": _local_bytes(s.model.parameters()),
                        "grads_bytes": _local_bytes(p for p in s.model.parameters() if p.requires_grad)}]
    try:
        result = native.train(s, record)
    finally:
        s.spec = spec
    if isinstance(s.model, torch.nn.parallel.DistributedDataParallel):
        s.model = s.model.module  # evaluation needs no gradient sync
    if spec.parallel == "zero1":
        s.optimizer = s.optimizer.optim  # this rank's own optimizer: the state it holds
    return result


def gather_to_rank0(value: Any) -> list[Any] | None:
    """Every rank's `value` (picklable), in rank order, on rank 0; None on the other ranks."""
    import torch.distributed as dist

    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values if dist.get_rank() == 0 else None


def _local_bytes(params) -> int:
    """Bytes this rank holds for `params`: a DTensor's local shard, a plain tensor whole."""
    from torch.distributed.tensor import DTensor

    from optbench.probes.measure import unique_tensor_bytes

    return unique_tensor_bytes(p.to_local() if isinstance(p, DTensor) else p for p in params)


def _ddp(s: Setup, record: Record) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    # Gradients as views of DDP's all-reduce buckets: one copy of the gradients, not two.
    device_ids = [torch.cuda.current_device()] if s.device.type == "cuda" else None
    s.model = DistributedDataParallel(s.model, device_ids=device_ids, gradient_as_bucket_view=True)


def _zero1(s: Setup, record: Record) -> None:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    _ddp(s, record)
    # The entry's factory as the "optimizer class": ZeRO calls it on each rank's share of the parameters
    # with these defaults, so the registry's own settings (default_kwargs) apply as in a plain trial.
    s.install_optimizer(lambda: ZeroRedundancyOptimizer(
        s.params, optimizer_class=s.entry.build, lr=record.lr, **s.spec.optimizer_kwargs))


def _fsdp2(s: Setup, record: Record) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # The mesh names the trial's device type: without one fully_shard picks CUDA whenever a GPU is visible,
    # which breaks a CPU (gloo) group on a GPU machine.
    mesh = init_device_mesh(s.device.type, (dist.get_world_size(),))
    blocks = set(getattr(s.model, "_no_split_modules", None) or ())
    for module in list(s.model.modules()):
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(s.model, mesh=mesh)
    s.params = [p for p in s.model.parameters() if p.requires_grad]
    s.install_optimizer(lambda: s.entry.build_for(s.model, lr=record.lr, **s.spec.optimizer_kwargs))




# -- the per-rank table ------------------------------------------------------------------------------
def per_rank_markdown(records: list[Record]) -> str:
    """One row per rank of each parallel record: what that rank held and how fast it stepped, with its
    weights + grads + state next to a ddp rank's of the same optimizer (the figure sharding is for)."""
    from tabulate import tabulate

    from optbench.report.frame import latest_per_trial
    from optbench.report.metrics import sharding_cell

    records = latest_per_trial(records)
    ddp_held = {r.optimizer: _held_bytes(r.per_rank[0]) for r in records
                if r.parallel == "ddp" and r.status == "ok" and r.per_rank}
    headers = ["optimizer", "parallel", "rank", "status", "weights MiB", "grads MiB", "state MiB",
               "weights+grads+state MiB", "% of a ddp rank", "train mem MiB", "step median ms", "eval acc",
               "state changed vs 1 process"]
    rows, notes = [], []
    ordered = sorted(records, key=lambda r: PARALLEL_MODES.index(r.parallel) if r.parallel in PARALLEL_MODES
                     else len(PARALLEL_MODES))
    for record in ordered:
        if not record.per_rank:
            continue
        for rank in record.per_rank:
            held = _held_bytes(rank)
            reference = ddp_held.get(record.optimizer)
            rows.append([record.optimizer, f"{record.parallel} x{record.world_size}", rank["rank"], rank["status"],
                         *(_fmt(rank.get(key), MIB, 2) for key in ("weights_bytes", "grads_bytes", "state_bytes")),
                         _fmt(held, MIB, 2), f"{100 * held / reference:.1f}" if held and reference else "",
                         _fmt(_train_memory(rank, record), MIB, 0), _fmt(rank.get("step_time_median_s"), 1e-3, 0),
                         _accuracy(rank.get("eval_accuracy"), record), sharding_cell(record) or ""])
        if record.status != "ok":
            notes.append(f"- {record.optimizer} under {record.parallel}: {record.status}: {record.error}")
    table = tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)
    return table + ("\n\n" + "\n".join(notes) if notes else "") + "\n"


def _accuracy(value: float | None, record: Record) -> str:
    """A rank's eval accuracy, or `untrained` where it sits at chance (report/bounds.py): no figure from a job that
    did not train."""
    from optbench.report.bounds import untrained

    return "untrained" if untrained(value, record.metric_chance, "max") else _fmt(value, 1, 3)


def _train_memory(rank: dict[str, Any], record: Record) -> int | None:
    """A rank's train memory by the report's rule (peaks.train_memory_bytes): its CUDA peak, or its RSS growth plus
    the gradients DDP's buckets held before the window."""
    return train_memory_bytes(Record(parallel=record.parallel, grads_bytes=rank.get("grads_bytes"),
                                     peak_rss_growth_bytes=rank.get("peak_rss_growth_bytes"),
                                     peak_cuda_allocated_bytes=rank.get("peak_cuda_allocated_bytes")))


def _held_bytes(rank: dict[str, Any]) -> int | None:
    parts = [rank.get(key) for key in ("weights_bytes", "grads_bytes", "state_bytes")]
    return None if None in parts else sum(parts)


def _fmt(value: float | None, unit: float, decimals: int) -> str:
    return "" if value is None else f"{value / unit:,.{decimals}f}"
