"""Whether sharding changes what an optimizer keeps: parameter by parameter, the state every rank holds under ZeRO-1
or FSDP2 against the state one process holds for the same optimizer.

Users of low-bit optimizers report that sharding silently changes the state: bitsandbytes keeps fp32 state for
tensors under 4096 elements, so a shard can fall under the threshold; torchao quantises a tensor only when its
block divides it, and under FSDP2 it decides on each rank's local shard; ZeRO-1 builds the optimizer from a bare
parameter list, so HF's fp32 override for embeddings (`adamw8bit_hf`) never reaches it. This module says, for each
parameter, whether that happened:

- a *precision* change: a rank holding state for the parameter keeps other state dtypes than one process does
  (uint8+fp32 against fp32), or no rank keeps the state one process keeps;
- a *bytes* change: the ranks keep more (or fewer) state bytes per element they hold than one process, by at least
  1 % and 1 KiB over the group (torchao's per-tensor quantisation map, copied on every rank that holds a shard;
  not a 4-byte `step` per shard). Under DDP every rank holds all of it, which is no change; the shared row
  (bitsandbytes' quantisation maps) is compared rank by rank.

Both sides are state maps (memory/statemap.py), measured or analytic: `run --parallel MODE --state-map` compares each
rank's measured map with one process's, built and stepped in rank 0 after training (trial/run.py); `explain
--parallel MODE --nproc N` compares the analytic map with the entry's rule applied to what each rank holds — ZeRO-1
hands each rank whole parameters (ZeroRedundancyOptimizer's greedy partition, largest first) and builds the entry
from bare tensors; FSDP2 gives rank r the r-th chunk of dim 0, and only an entry known to apply its rule to each
local shard (`OptimizerSpec.fsdp2 == "local"`) can be predicted there.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from optbench.job.spec import PARALLEL_MODES
from optbench.memory.statemap import LINE_CHARS, SHARED, SHARED_ROW_NAME, StateRow, explain_model, module_kind
from optbench.optimizers import OptimizerSpec, Param, resolve
from optbench.records.record import MIB
from optbench.records.text import clip

RELATIVE_TOLERANCE = 0.01  # a bytes change: at least 1 % of one process's bytes for the parameter ...
ABSOLUTE_TOLERANCE_BYTES = 1024  # ... and at least 1 KiB (a per-shard scalar is not a change)


@dataclass(frozen=True)
class Change:
    """One parameter (or the shared row) whose state sharding changed."""

    name: str
    kind: str  # "precision" | "bytes"
    single: str  # one process: dtypes and bytes per element, "uint8+fp32, 2.03 B/elt"
    sharded: str  # the ranks: "fp32, 8.00 B/elt (ranks 0, 1)"
    why: str = ""  # an analytic comparison's rules: "8-bit -> fp32: block size does not divide"

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def local_rows(rows: Sequence[StateRow], model: Any) -> list[StateRow]:
    """A rank's measured map with each parameter's element count as this rank holds it (a DTensor's local shard)."""
    local = {name: (t.to_local() if hasattr(t, "to_local") else t).numel() for name, t in model.named_parameters()}
    return [dataclasses.replace(row, numel=local.get(row.name, row.numel)) for row in rows]


def _dtypes(row: StateRow) -> str:
    return row.state_dtypes


def _per_element(state_bytes: int, numel: int) -> str:
    return f"{state_bytes / numel:.2f} B/elt" if numel else f"{state_bytes:,} B"


def _holders(name: str, ranks: Sequence[Sequence[StateRow]]) -> list[tuple[int, StateRow]]:
    """(rank, row) for each rank that keeps state for the parameter."""
    found = []
    for rank, rows in enumerate(ranks):
        row = next((r for r in rows if r.name == name), None)
        if row is not None and row.state_bytes:
            found.append((rank, row))
    return found


def _change(single: StateRow, holders: list[tuple[int, StateRow]], nproc: int) -> Change | None:
    """The change sharding made to one parameter's state (None: none); the ranks that hold it are named unless all
    of them do. Each holding rank should keep one process's bytes in proportion to the elements it holds (all of
    them under DDP and ZeRO-1, its shard under FSDP2; the shared row: one process's own); a bytes change is the
    ranks' excess over that, or shortfall, beyond the tolerance."""
    shared = single.name == SHARED_ROW_NAME
    total, held = sum(row.state_bytes for _, row in holders), sum(row.numel for _, row in holders)
    share = len(holders) if shared else held / single.numel if single.numel else 0.0
    dtypes = sorted({_dtypes(row) for _, row in holders}) or ["-"]
    ranks = f" (rank {', '.join(str(rank) for rank, _ in holders)})" if len(holders) < nproc else ""
    sharded = f"{' / '.join(dtypes)}, {_per_element(total // max(1, len(holders)) if shared else total, held)}{ranks}"
    sharded = sharded if holders else "no state on any rank"
    once = f"{_dtypes(single)}, {_per_element(single.state_bytes, 0 if shared else single.numel)}"
    whys = sorted({row.why for _, row in holders if row.why != single.why})
    why = f"{single.why} -> {' / '.join(whys)}" if whys and not shared else ""
    if dtypes != [_dtypes(single)] and not shared:
        return Change(single.name, "precision", once, sharded, why)
    expected = single.state_bytes * (share or 1)
    if abs(total - expected) >= max(ABSOLUTE_TOLERANCE_BYTES, RELATIVE_TOLERANCE * expected):
        return Change(single.name, "bytes", once, sharded, why)
    return None


def compare(single: Sequence[StateRow], ranks: Sequence[Sequence[StateRow]]) -> list[Change]:
    """Every parameter (and the shared row) whose state differs between one process (`single`) and the ranks
    (`ranks[r]`: rank r's rows, each with the element count that rank holds), in `single`'s order."""
    changes = []
    rows = list(single)
    if not any(row.name == SHARED_ROW_NAME for row in rows) and any(_holders(SHARED_ROW_NAME, ranks)):
        rows.append(StateRow(SHARED_ROW_NAME, (), 0, SHARED, {}, ""))  # shared state that one process lacks
    for row in rows:
        if row.state_bytes == 0 and not _holders(row.name, ranks):
            continue
        change = _change(row, _holders(row.name, ranks), len(ranks))
        if change is not None:
            changes.append(change)
    return changes


# -- the prediction ------------------------------------------------------------------------------------------------
def fsdp2_rows(numel_dim0: int, nproc: int) -> list[int]:
    """Rows of dim 0 each rank holds under FSDP2 (torch.chunk: ceil(d/N) each, the last ranks fewer or none)."""
    chunk = math.ceil(numel_dim0 / nproc)
    return [max(0, min(chunk, numel_dim0 - rank * chunk)) for rank in range(nproc)]


def zero1_owners(params: Sequence[Param], nproc: int) -> list[int]:
    """The rank ZeroRedundancyOptimizer gives each parameter: largest first, each to the least loaded rank so far."""
    owners, sizes = [0] * len(params), [0] * nproc
    for index in sorted(range(len(params)), key=lambda i: params[i].numel, reverse=True):
        rank = sizes.index(min(sizes))
        owners[index], sizes[rank] = rank, sizes[rank] + params[index].numel
    return owners


def _rows_for(spec: OptimizerSpec, held: list[tuple[Param, Param]], settings: dict[str, Any]) -> list[StateRow]:
    """One rank's rows: (the parameter, what of it this rank's optimizer sees) -> the rule on the latter."""
    states = [spec.rule(seen, **settings) for _, seen in held]
    rows = [StateRow(p.name, seen.shape, seen.numel, module_kind(p.name, p), dict(state.bytes_by_dtype), state.why,
                     state.fp32_state_numel) for (p, seen), state in zip(held, states, strict=True)]
    shared = spec.shared(states, **settings)
    if shared is not None:
        rows.append(StateRow(SHARED_ROW_NAME, (), 0, SHARED, dict(shared.bytes_by_dtype), shared.why))
    return rows


def predicted_ranks(spec: OptimizerSpec, params: Sequence[Param], mode: str, nproc: int,
                    **kwargs: Any) -> list[list[StateRow]]:
    """Each rank's analytic rows for `params` (an entry's model facts) under `mode`; ValueError with the reason where
    the entry's behaviour under the mode is not known (or is a failure)."""
    settings = spec.settings(kwargs)
    if mode == "ddp":
        return [_rows_for(spec, [(p, p) for p in params], settings) for _ in range(nproc)]
    if mode == "zero1":  # built from bare tensors: no names, no structure
        owners = zero1_owners(params, nproc)
        bare = {id(p): Param(shape=p.shape, itemsize=p.itemsize, dtype=p.dtype) for p in params}
        return [_rows_for(spec, [(p, bare[id(p)]) for p, owner in zip(params, owners, strict=True) if owner == rank],
                          settings) for rank in range(nproc)]
    if mode != "fsdp2":
        raise ValueError(f"unknown parallel mode '{mode}'; known: {', '.join(PARALLEL_MODES)}")
    if spec.fsdp2 != "local":
        raise ValueError(f"{spec.name} under FSDP2 cannot be predicted: " + (
            spec.fsdp2 or "how it treats sharded (DTensor) parameters is not known; measure it with `run --parallel "
                          "fsdp2 --state-map`"))
    held = [[] for _ in range(nproc)]
    for p in params:
        for rank, rows in enumerate(fsdp2_rows(p.shape[0], nproc)):
            held[rank].append((p, dataclasses.replace(p, shape=(rows, *p.shape[1:]))))
    return [_rows_for(spec, rank_held, settings) for rank_held in held]


def predict(optimizer: str, mode: str, nproc: int, workload: str | None = None, model: str | None = None,
            **kwargs: Any) -> tuple[list[StateRow], list[list[StateRow]], list[Change]]:
    """(one process's analytic rows, each rank's, the changes) for the model `explain` would build (meta device)."""
    spec = resolve(optimizer)
    params = spec.model_facts(explain_model(workload, model))
    ranks = predicted_ranks(spec, params, mode, nproc, **kwargs)
    single = _rows_for(spec, [(p, p) for p in params], spec.settings(kwargs))
    return single, ranks, compare(single, ranks)


# -- what explain prints, and the table of records -----------------------------------------------------------------


def render(single: Sequence[StateRow], ranks: Sequence[Sequence[StateRow]], changes: Sequence[Change],
           title: str) -> str:
    """Each rank's state against one process's, then every parameter whose state changes (one line each, clipped
    to 120 characters); the identical layers of a layer stack collapse as in the state map."""
    lines = [title, f"one process: {sum(r.state_bytes for r in single) / MIB:,.2f} MiB of state"]
    described = []
    for rows in ranks:
        held = [r for r in rows if r.state_bytes and r.module_kind != SHARED]
        described.append(f"{sum(r.state_bytes for r in rows) / MIB:,.2f} MiB of state for {len(held)} parameter(s) "
                         f"({sum(r.numel for r in held):,} elements)")
    # consecutive ranks that hold alike share a line: ZeRO-1 over more ranks than parameters left a million lines
    # of "0.00 MiB" for --nproc 1000000
    for text, group in itertools.groupby(enumerate(described), key=lambda pair: pair[1]):
        numbers = [rank for rank, _ in group]
        lines.append(f"rank {numbers[0]}: {text}" if len(numbers) == 1 else
                     f"ranks {numbers[0]}-{numbers[-1]} ({len(numbers):,}), each: {text}")
    if not changes:
        lines.append("no parameter's state changes precision or bytes per element under sharding")
        return "\n".join(lines)
    lines.append(f"{len(changes)} parameter(s) whose state changes under sharding (one process -> the ranks; "
                 "identical layers on one line):")
    for change, count in _grouped(changes):
        times = f" x{count}" if count > 1 else ""
        for line in (f"  {change.name}{times} ({change.kind}): {change.single} -> {change.sharded}",
                     f"    why: {change.why}" if change.why else ""):
            lines += [clip(line, LINE_CHARS)] if line else []
    return "\n".join(lines)


def _grouped(changes: Sequence[Change]) -> list[tuple[Change, int]]:
    """Changes identical but for a layer index (`layer.0.` ~ `layer.1.`), as (the first named with `*`, how many)."""
    groups: dict[tuple, list[Change]] = {}
    for change in changes:
        name = re.sub(r"(?<=\.)\d+(?=\.)", "*", change.name)
        groups.setdefault((name, change.kind, change.single, change.sharded, change.why), []).append(change)
    return [(dataclasses.replace(members[0], name=key[0] if len(members) > 1 else members[0].name), len(members))
            for key, members in groups.items()]


def explain(optimizer: str, mode: str, nproc: int, workload: str | None = None, model: str | None = None) -> str:
    """`optbench explain OPT --parallel MODE --nproc N`: the prediction, or the one line saying why there is none."""
    title = f"{resolve(optimizer).name} under {mode} x{nproc}: each rank's analytic state against one process's"
    try:
        single, ranks, changes = predict(optimizer, mode, nproc, workload, model)
    except ValueError as exc:
        return f"{title}\n{exc}"
    return render(single, ranks, changes, title)


def changes_markdown(records: Sequence[Any]) -> str:
    """The sharding check of each parallel record (`run --parallel MODE --state-map`): how many parameters it
    compared and which changed, then one line per changed parameter."""
    from tabulate import tabulate

    from optbench.report.frame import latest_per_trial

    rows, notes = [], []
    for record in latest_per_trial(records):
        if record.parallel in (None, "none"):
            continue
        changes = record.sharding_state_changes
        label = f"{record.parallel} x{record.world_size}"
        if changes is None:
            status = record.status if record.status != "ok" else "not checked (no --state-map)"
            rows.append([record.optimizer, label, status, "", "", ""])
            if record.status != "ok":
                notes.append(f"- {record.optimizer} under {label}: {record.status}: {record.error}")
            continue
        kinds = [c["kind"] for c in changes]
        rows.append([record.optimizer, label, record.status, record.sharding_checked_params,
                     kinds.count("precision"), kinds.count("bytes")])
        notes += [f"- {record.optimizer} under {label}: `{c['name']}` ({c['kind']}): {c['single']} -> {c['sharded']}"
                  for c in changes]
    table = tabulate(rows, headers=["optimizer", "parallel", "status", "params compared", "precision changed",
                                    "bytes/element changed"], tablefmt="github", disable_numparse=True)
    return table + ("\n\n" + "\n".join(notes) if notes else "") + "\n"
