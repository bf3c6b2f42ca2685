"""Data-parallel trials across processes: DDP, ZeRO-1 and FSDP2, one `torchrun` group per trial.

A trial with `parallel != "none"` runs as `torchrun --standalone --nproc-per-node N -m optbench.trial
SPEC RECORD` (`launch_command`), started and timed out by `executors.LocalExecutor` like any trial's
process (`run_trial` in a plain process goes through it too) and returning the record rank 0 wrote.
Inside the group every rank runs the
ordinary trial (setup, engine, describe, evaluate) with this module's engine, which wraps the model and
the optimizer for the mode and then trains with the native loop:

- ddp:   `DistributedDataParallel` (gradients averaged by all-reduce); every rank holds all of the state.
- zero1: DDP + `ZeroRedundancyOptimizer` around the registry entry's own factory (`entry.build`, so its
         default settings hold): each rank keeps the state of its share of the parameters only.
- fsdp2: `fully_shard` on each block the model names in `_no_split_modules`, then on the root; the
         optimizer is built after sharding, over DTensor parameters, so weights, gradients and state are
         all sharded. An optimizer that cannot take DTensors fails here: the record keeps its message.

Data: each rank trains on its own 1/N of the training rows with batch `batch_size // N` (what a
`DistributedSampler` does), so the global batch is the spec's. Each rank measures its own state bytes
(DTensor state counted by its local shard), peak memory and step times; rank 0 gathers them with
`all_gather_object` into `record.per_rank` and writes the record. The top-level figures are rank 0's;
the loss curve is rank 0's shard loss.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbench.engines import EngineResult
from optbench.results import MIB

if TYPE_CHECKING:
    from optbench.plan import TrialSpec
    from optbench.results import Record
    from optbench.trial import Setup

MODES = ("ddp", "zero1", "fsdp2")
# What each rank reports (read from its own record after the trial): the per-rank view of the report.
RANK_FIELDS = ("status", "error", "state_bytes", "state_bytes_by_key", "peak_rss_bytes", "peak_rss_growth_bytes",
               "peak_cuda_allocated_bytes", "peak_cuda_reserved_bytes", "first_step_s", "step_time_median_s",
               "optimizer_step_median_s", "train_loss_final", "eval_accuracy")


# -- launching ---------------------------------------------------------------------------------------
def launch_command(spec: TrialSpec, spec_path: Path, record_path: Path) -> list[str]:
    """The command that runs `spec` as a torchrun group; rank 0 writes the record to `record_path`.

    `python -m torch.distributed.run` is `torchrun` from this interpreter (the venv's torch, whatever
    PATH says); `--standalone` picks a free rendezvous port on this host.
    """
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(spec.nproc),
            "-m", "optbench.trial", str(spec_path), str(record_path)]


def in_group() -> bool:
    """True inside a torchrun rank (torchrun sets LOCAL_RANK and WORLD_SIZE for each worker)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


# -- inside a rank -----------------------------------------------------------------------------------
def _exit_with_launcher() -> None:
    """torchrun starts each worker in its own session, so a launcher killed outright (the runner's
    timeout) would leave the ranks running: each rank leaves as soon as its parent is gone."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def rank_main(spec: TrialSpec, record_path: Path) -> int:
    """A torchrun worker's entry: join the group, run the trial, gather every rank's figures, and let
    rank 0 write the record."""
    import torch
    import torch.distributed as dist

    from optbench.trial import run_trial

    _exit_with_launcher()
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = spec.device.startswith("cuda") or (spec.device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(local_rank)  # "cuda" then means this rank's GPU everywhere in the trial
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    try:
        record = run_trial(spec)
        merged = gather(record)
        if dist.get_rank() == 0:
            record_path.write_text(json.dumps(merged.to_dict(), default=str))
    finally:
        dist.destroy_process_group()
    return 0


def gather(record: Record) -> Record:
    """Every rank's figures into `per_rank` (rank order); the record fails if any rank failed."""
    import torch.distributed as dist

    mine = {"rank": dist.get_rank(), **(record.per_rank[0] if record.per_rank else {}),
            **{name: getattr(record, name) for name in RANK_FIELDS}}
    ranks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    merged = dataclasses.replace(record, per_rank=ranks, world_size=len(ranks))
    failed = next((r for r in ranks if r["status"] != "ok"), None)
    if failed is not None and record.status == "ok":
        merged.status, merged.error = failed["status"], f"rank {failed['rank']}: {failed['error']}"
    return merged


# -- the engine --------------------------------------------------------------------------------------
def train(s: Setup, record: Record) -> EngineResult:
    """Shard the data, wrap model and optimizer for the mode, train with the native loop, then leave the
    trial a model it can evaluate and the optimizer that holds this rank's state."""
    import torch
    import torch.distributed as dist

    from optbench.engines import native
    from optbench.workloads.base import take

    spec = s.spec
    rank, world = dist.get_rank(), dist.get_world_size()
    s.built = dataclasses.replace(s.built, train=take(s.built.train, slice(rank, None, world)))
    s.spec = dataclasses.replace(spec, batch_size=max(1, spec.batch_size // world))
    wrap = {"ddp": _ddp, "zero1": _zero1, "fsdp2": _fsdp2}[spec.parallel]
    wrap(s, record)
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


def _local_bytes(params) -> int:
    """Bytes this rank holds for `params`: a DTensor's local shard, a plain tensor whole."""
    from optbench.measure import unique_tensor_bytes

    return unique_tensor_bytes(getattr(p, "_local_tensor", p) for p in params)


def _rebuild_optimizer(s: Setup, record: Record, make) -> None:
    """Replace the setup's optimizer (no state yet: nothing was stepped) and re-attach the schedule."""
    import torch

    from optbench import measure
    from optbench.trial import lr_lambda

    s.optimizer = make()
    s.scheduler = torch.optim.lr_scheduler.LambdaLR(s.optimizer, lr_lambda(s.spec.warmup_steps))
    measure.slow_down_if_asked(s.optimizer)


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
    _rebuild_optimizer(s, record, lambda: ZeroRedundancyOptimizer(
        s.params, optimizer_class=s.entry.build, lr=record.lr, **s.spec.optimizer_kwargs))


def _fsdp2(s: Setup, record: Record) -> None:
    from torch.distributed.fsdp import fully_shard

    blocks = set(getattr(s.model, "_no_split_modules", None) or ())
    for module in list(s.model.modules()):
        if type(module).__name__ in blocks:
            fully_shard(module)
    fully_shard(s.model)
    s.params = [p for p in s.model.parameters() if p.requires_grad]
    _rebuild_optimizer(s, record, lambda: s.entry.build_for(s.model, lr=record.lr, **s.spec.optimizer_kwargs))




# -- the per-rank table ------------------------------------------------------------------------------
def per_rank_markdown(records: list[Record]) -> str:
    """One row per rank of each parallel record: what that rank held and how fast it stepped, with its
    weights + grads + state next to a ddp rank's of the same optimizer (the figure sharding is for)."""
    from tabulate import tabulate


    ddp_held = {r.optimizer: _held_bytes(r.per_rank[0]) for r in records
                if r.parallel == "ddp" and r.status == "ok" and r.per_rank}
    headers = ["optimizer", "parallel", "rank", "status", "weights MiB", "grads MiB", "state MiB",
               "weights+grads+state MiB", "% of a ddp rank", "peak RSS growth MiB", "step median ms", "eval acc"]
    rows, notes = [], []
    ordered = sorted(records, key=lambda r: MODES.index(r.parallel) if r.parallel in MODES else len(MODES))
    for record in ordered:
        if not record.per_rank:
            continue
        for rank in record.per_rank:
            held = _held_bytes(rank)
            reference = ddp_held.get(record.optimizer)
            rows.append([record.optimizer, f"{record.parallel} x{record.world_size}", rank["rank"], rank["status"],
                         *(_fmt(rank.get(key), MIB, 2) for key in ("weights_bytes", "grads_bytes", "state_bytes")),
                         _fmt(held, MIB, 2), f"{100 * held / reference:.1f}" if held and reference else "",
                         _fmt(rank.get("peak_rss_growth_bytes"), MIB, 0), _fmt(rank.get("step_time_median_s"), 1e-3, 0),
                         _fmt(rank.get("eval_accuracy"), 1, 3)])
        if record.status != "ok":
            notes.append(f"- {record.optimizer} under {record.parallel}: {record.status}: {record.error}")
    table = tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)
    return table + ("\n\n" + "\n".join(notes) if notes else "") + "\n"


def _held_bytes(rank: dict[str, Any]) -> int | None:
    parts = [rank.get(key) for key in ("weights_bytes", "grads_bytes", "state_bytes")]
    return None if None in parts else sum(parts)


def _fmt(value: float | None, unit: float, decimals: int) -> str:
    return "" if value is None else f"{value / unit:,.{decimals}f}"
