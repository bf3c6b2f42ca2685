"""The state map: for each parameter, the optimizer state it gets (bytes, dtypes) and why.

One number (`fp32 state %`) cannot answer "why no memory saving?": bitsandbytes keeps fp32 state for
tensors under 4096 elements, HF's `adamw_bnb_8bit` keeps embeddings fp32, GaLore projects only hidden
matrices, Muon hands embeddings, head and vectors to AdamW. The map shows where each byte sits.

Two maps with the same rows: `analytic_state_map` applies a registry entry's per-parameter rule (the
same rule its analytic count sums, so it needs no library and no weights: `optbench explain` runs it on
a meta-device model), and `measured_state_map` walks a stepped optimizer's real state. The tests hold
them equal parameter by parameter and dtype by dtype. A storage the optimizer shares between parameters
or keeps for itself (bitsandbytes' quantisation maps) belongs to no parameter: it goes to a shared row.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optbench.optimizers import OptimizerSpec, Param, describe_model, resolve
from optbench.optimizers.base import HEAD_MODULE_NAMES, MODULE_KINDS, dtype_name, short_dtype
from optbench.records.record import MIB
from optbench.records.text import clip, size_text

SHARED = "shared"  # the module kind (and `bytes_by_module` key) of the shared row
SHARED_ROW_NAME = "(shared)"
LINE_CHARS = 120
# Parameter-name parts that mark the output head beside HEAD_MODULE_NAMES: BERT's pooler feeds only the head.
_HEAD_PARTS = HEAD_MODULE_NAMES | {"pooler"}


class StateMapError(ValueError):
    """A model or optimizer the state map cannot be made for; the one-line message says what to do."""


@dataclass(frozen=True)
class StateRow:
    """One parameter's optimizer state (or the shared row): what it holds, in which dtypes, and why.

    `fp32_state_numel` is the analytic rule's full-size fp32 share; None in a measured row (the real state
    shows dtypes, not which of them a scheme failed to compress)."""

    name: str
    shape: tuple[int, ...]
    numel: int
    module_kind: str
    state_bytes_by_dtype: dict[str, int]
    why: str
    fp32_state_numel: int | None = None

    @property
    def state_bytes(self) -> int:
        return sum(self.state_bytes_by_dtype.values())

    @property
    def state_dtypes(self) -> str:
        """Short dtype summary, biggest share first: "uint8+fp32"; "-" without state."""
        ordered = sorted(self.state_bytes_by_dtype.items(), key=lambda item: -item[1])
        return "+".join(short_dtype(dtype) for dtype, _ in ordered) or "-"


def module_kind(param_name: str, facts: Param | None = None) -> str:
    """embeddings | attention | mlp | norms/biases | head, from the parameter's name (and facts when given).

    Works for BERT (embeddings.*, encoder.layer.N.attention.*, intermediate/output dense, LayerNorm and
    biases, pooler/classifier) and Llama-style decoders (embed_tokens, self_attn, mlp, norm, lm_head).
    Checked in that order of precedence: head, embeddings, norms/biases (so an attention bias is a bias),
    attention; every other weight of the body counts as mlp."""
    parts = param_name.lower().split(".")
    if (facts is not None and facts.head) or any(part in _HEAD_PARTS for part in parts):
        return "head"
    if (facts is not None and facts.embedding) or any(part.startswith("embed") or part in ("wte", "wpe")
                                                      for part in parts):
        return "embeddings"
    vector = len(facts.shape) < 2 if facts is not None else parts[-1] == "bias"
    if vector or any("norm" in part or part.startswith("ln_") or part == "ln_f" for part in parts):
        return "norms/biases"
    if any("attn" in part or "attention" in part for part in parts):
        return "attention"
    return "mlp"


def _facts_by_name(model: Any) -> dict[str, Param]:
    return {facts.name: facts for facts, _ in describe_model(model)}


def analytic_state_map(entry: str | OptimizerSpec, model: Any, **kwargs: Any) -> list[StateRow]:
    """The entry's rule applied to each trainable parameter of `model` (meta-device models work: only
    shapes and dtypes are read), as `entry.build_for(model, **kwargs)` would optimise it; plus the
    shared row where the entry has one."""
    spec = resolve(entry) if isinstance(entry, str) else entry
    facts = _facts_by_name(model)
    state_map = spec.analytic_map_for(model, **kwargs)
    rows = [StateRow(p.name, p.shape, p.numel, module_kind(p.name, facts[p.name]), dict(state.bytes_by_dtype),
                     state.why, state.fp32_state_numel) for p, state in state_map.params]
    if state_map.shared is not None:
        shared = state_map.shared
        rows.append(_shared_row(shared.bytes_by_dtype, shared.why, shared.fp32_state_numel))
    return rows


def _shared_row(bytes_by_dtype: dict[str, int], why: str, fp32_state_numel: int | None = None) -> StateRow:
    return StateRow(SHARED_ROW_NAME, (), 0, SHARED, dict(bytes_by_dtype), why, fp32_state_numel)


@dataclass
class _Storage:
    nbytes: int
    dtype: str
    owners: dict[int, None]  # ids of the parameters whose state holds it, in first-seen order
    keys: dict[str, None]  # the state keys it appears under


def _optimizer_held(optimizer: Any) -> set[tuple[str, int]]:
    """Storages an optimizer keeps outside its per-parameter state, such as bitsandbytes' `name2qmap`:
    optimizer-wide, so charged to the shared row even when one parameter uses them. Looks through a combined
    optimizer's parts and a wrapper's inner `optimizer` (accelerate's AcceleratedOptimizer)."""
    from optbench.probes.measure import leaf_tensors, storage_key

    held, seen, todo = set(), set(), [optimizer]
    while todo:
        part = todo.pop()
        if id(part) in seen:
            continue
        seen.add(id(part))
        todo += [*getattr(part, "parts", []), *filter(None, [getattr(part, "optimizer", None)])]
        for attribute, value in vars(part).items():
            if attribute not in ("state", "param_groups", "defaults"):
                held.update(storage_key(leaf) for leaf in leaf_tensors(value))
    return held


def _storages(optimizer: Any) -> dict[tuple[str, int], _Storage]:
    """Every storage behind the optimizer's state, once, with the parameters and keys that hold it
    (tensor subclasses through their inner tensors, as `optbench.probes.measure` counts them)."""
    from optbench.probes.measure import leaf_tensors, storage_key

    storages: dict[tuple[str, int], _Storage] = {}
    for param, state in optimizer.state.items():
        for key, value in state.items():
            for leaf in leaf_tensors(value):
                found = storages.setdefault(storage_key(leaf), _Storage(0, dtype_name(leaf.dtype), {}, {}))
                found.nbytes = max(found.nbytes, leaf.untyped_storage().nbytes())
                found.owners[id(param)] = None
                found.keys[key] = None
    return storages


def measured_state_map(optimizer: Any, model: Any) -> list[StateRow]:
    """The real state of a built and stepped `optimizer` over `model`'s trainable parameters, one row each in
    `model.parameters()` order (no state: zero bytes), plus a shared row for storages held by several
    parameters or by the optimizer itself. Each storage is counted once: the rows add up to
    `optbench.probes.measure.optimizer_state_bytes(optimizer)`."""
    pairs = describe_model(model)
    known = {id(tensor) for _, tensor in pairs}
    stray = [param for param in optimizer.state if id(param) not in known]
    if stray:
        raise StateMapError(f"the optimizer holds state for {len(stray)} tensor(s) that are not trainable parameters "
                            "of the model; pass the model the optimizer was built for")
    held = _optimizer_held(optimizer)
    per_param: dict[int, tuple[dict[str, int], dict[str, None]]] = {id(t): ({}, {}) for _, t in pairs}
    shared: tuple[dict[str, int], dict[str, None]] = ({}, {})
    for storage_key, storage in _storages(optimizer).items():
        sole = len(storage.owners) == 1 and storage_key not in held
        bytes_by_dtype, keys = per_param[next(iter(storage.owners))] if sole else shared
        bytes_by_dtype[storage.dtype] = bytes_by_dtype.get(storage.dtype, 0) + storage.nbytes
        keys.update(storage.keys)
    rows = []
    for facts, tensor in pairs:
        bytes_by_dtype, keys = per_param[id(tensor)]
        why = "state: " + ", ".join(keys) if keys else "no state"
        rows.append(StateRow(facts.name, facts.shape, facts.numel, module_kind(facts.name, facts), bytes_by_dtype,
                             why))
    if shared[0]:
        rows.append(_shared_row(shared[0], "shared state: " + ", ".join(shared[1])))
    return rows


def bytes_by_module(rows: Iterable[StateRow]) -> dict[str, int]:
    """State bytes per module kind, every kind present (0 when empty), the shared row under "shared":
    `Record.state_bytes_by_module`, the stacked bars of the report's figure."""
    totals = dict.fromkeys((*MODULE_KINDS, SHARED), 0)
    for row in rows:
        totals[row.module_kind] += row.state_bytes
    return totals


def write_state_map(rows: Sequence[StateRow], path: str | Path) -> Path:
    """The full map as CSV (one line per parameter, the shared row last): bytes in total and per dtype
    (`state_bytes_<dtype>` columns), for pandas or a spreadsheet."""
    import pandas as pd

    dtypes = sorted({dtype for row in rows for dtype in row.state_bytes_by_dtype})
    table = pd.DataFrame([{
        "name": row.name, "shape": "x".join(map(str, row.shape)), "numel": row.numel,
        "module_kind": row.module_kind, "state_dtypes": row.state_dtypes, "state_bytes": row.state_bytes,
        **{f"state_bytes_{dtype}": row.state_bytes_by_dtype.get(dtype, 0) for dtype in dtypes},
        "fp32_state_numel": row.fp32_state_numel, "why": row.why,
    } for row in rows])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False)
    return path


def group_rows(rows: Sequence[StateRow]) -> list[tuple[StateRow, int]]:
    """Rows identical but for a layer index (`layer.3.` ~ `layer.5.`), collapsed into (first row named with
    `*` for the index, how many), in first-seen order: six layers' rows read as one line each."""
    groups: dict[tuple, list[StateRow]] = {}
    for row in rows:
        name = re.sub(r"(?<=\.)\d+(?=\.)", "*", row.name)
        key = (name, row.shape, tuple(sorted(row.state_bytes_by_dtype.items())), row.why, row.module_kind)
        groups.setdefault(key, []).append(row)
    collapsed = []
    for (name, *_), members in groups.items():
        first = members[0]
        grouped = StateRow(name if len(members) > 1 else first.name, first.shape, first.numel, first.module_kind,
                           first.state_bytes_by_dtype, first.why, first.fp32_state_numel)
        collapsed.append((grouped, len(members)))
    return collapsed


def _display_prefix(rows: Sequence[StateRow]) -> str:
    """The first name part most parameters share ("bert.", "model."): dropped from displayed names to keep
    lines short (a line under the title says so); "" when none covers more than half of them."""
    firsts = [row.name.split(".")[0] + "." for row in rows if "." in row.name]
    top = max(set(firsts), key=firsts.count, default="")
    return top if firsts.count(top) * 2 > len(rows) else ""


def _section(kind: str, members: list[tuple[StateRow, int]]) -> str:
    numel, state_bytes = sum(r.numel * c for r, c in members), sum(r.state_bytes * c for r, c in members)
    if kind == SHARED:
        return f"{kind}: {size_text(state_bytes)} state held for all parameters"
    return f"{kind}: {numel:,} params, {size_text(state_bytes)} state, {state_bytes / numel:.2f} B/param"


def _table_lines(rows: Sequence[StateRow], prefix: str) -> list[str]:
    """One line per parameter or group of identical layers, in sections by module kind (each headed by its
    totals), the shared row last."""
    groups = group_rows(rows)
    names = {id(row): row.name.removeprefix(prefix) + (f" x{count}" if count > 1 else "") for row, count in groups}
    cells = {id(row): ("x".join(map(str, row.shape)), row.state_dtypes, size_text(row.state_bytes * count))
             for row, count in groups}
    name_width = min(max(map(len, names.values())), 52)
    shape_width, dtype_width, size_width = (max(len(title), *(len(c[i]) for c in cells.values()))
                                            for i, title in enumerate(("shape", "dtypes", "state")))
    lines = [f"  {'parameter':<{name_width}} {'shape':>{shape_width}} {'dtypes':<{dtype_width}} "
             f"{'state':>{size_width}}  why"]
    for kind in (*MODULE_KINDS, SHARED):
        members = [(row, count) for row, count in groups if row.module_kind == kind]
        lines += [_section(kind, members)] if members else []
        for row, _ in members:
            shape, dtypes, size = cells[id(row)]
            line = (f"  {clip(names[id(row)], name_width, left=True):<{name_width}} {shape:>{shape_width}} "
                    f"{dtypes:<{dtype_width}} {size:>{size_width}}  ")
            lines.append(line + clip(row.why, LINE_CHARS - len(line)))
    return lines


FULL_FP32 = "full-size fp32 state"  # a parameter with state as large as an fp32 copy of it, or larger


def _answer(rows: Sequence[StateRow], prefix: str) -> str:
    """The one-line answer to "why no memory saving?": the share of parameters on full-size fp32 state, the
    module kinds it sits in (the top three) and the parameter that holds most of it, if one does and it fits.
    Said as a fact, not as that question: for LoMo (no state) or Adafactor (factored) the question was false."""
    params = [row for row in rows if row.module_kind != SHARED]
    if any(row.fp32_state_numel is None for row in params):
        return f"{FULL_FP32}: see the analytic map (optbench explain): a measured map shows only dtypes"
    numel = sum(row.numel for row in params)
    fp32_numel = sum(row.fp32_state_numel for row in params)
    if not fp32_numel:
        return f"{FULL_FP32}: none (each parameter's state is smaller than an fp32 copy of it, or absent)"
    by_kind = {kind: sum(r.fp32_state_numel for r in params if r.module_kind == kind) for kind in MODULE_KINDS}
    top = sorted(((n, kind) for kind, n in by_kind.items() if n / fp32_numel >= 0.005), reverse=True)[:3]
    text = (f"{FULL_FP32}: {_percent(fp32_numel / numel)} of params: "
            + ", ".join(f"{kind} {_percent(n / fp32_numel)}" for n, kind in top))
    biggest = max(params, key=lambda row: row.fp32_state_numel)
    mostly = f"; mostly {biggest.name.removeprefix(prefix)}" if 2 * biggest.fp32_state_numel > fp32_numel else ""
    return text + mostly if len(text + mostly) <= LINE_CHARS else clip(text, LINE_CHARS)


def _percent(fraction: float) -> str:
    """52.6 %, 100 %; small shares keep two significant digits (0.14 %) instead of reading 0.0 %."""
    percent = 100 * fraction
    return f"{percent:.1f} %".replace(".0 %", " %") if percent >= 1 else f"{percent:.2g} %"


def render_explain(rows: Sequence[StateRow], title: str = "") -> str:
    """What `optbench explain` prints: the title, the map (identical layers collapsed), the total bytes and
    bytes/param, and the one-line answer to "why no memory saving?". Every line fits 120 characters."""
    if not rows:
        return "\n".join([*([title] if title else []), "no trainable parameters: no optimizer state"])
    prefix = _display_prefix(rows)
    numel = sum(row.numel for row in rows)
    state_bytes = sum(row.state_bytes for row in rows)
    lines = [clip(title, LINE_CHARS)] if title else []
    lines += [f"names below drop their leading '{prefix}'"] if prefix else []
    lines += _table_lines(rows, prefix)
    lines.append(f"total: {numel:,} params, {state_bytes:,} state bytes ({state_bytes / MIB:.2f} MiB), "
                 f"{state_bytes / numel if numel else 0:.4f} bytes/param")
    lines.append(_answer(rows, prefix))
    return "\n".join(lines)


def _job(workload: str | None, model: str | None) -> Any:
    """The job `optbench explain` speaks of: `workload` (default: the default one), `model` in its role."""
    from optbench.job.spec import TrialSpec

    return TrialSpec(optimizer="adamw", model=model, **({"workload": workload} if workload else {}))


def explain_model(workload: str | None = None, model: str | None = None) -> Any:
    """The model a job of `workload` (default: the default workload) would train, or `model` (a local folder or
    cached HF id) in that workload's role, built on the meta device by the workload (`Workload.meta_model`, configs
    read offline): shapes and dtypes without weights, so any size explains in seconds."""
    from optbench.workloads import get_workload

    job = _job(workload, model)
    return get_workload(job.workload).meta_model(job, local_files_only=True)


def explain(optimizer: str, workload: str | None = None, model: str | None = None, **optimizer_kwargs: Any) -> str:
    """`optbench explain OPTIMIZER [--workload W] [--model M]`: the analytic state map, rendered; no training,
    and no optimizer library needed (the rule is plain arithmetic)."""
    from optbench.workloads import get_workload

    spec = resolve(optimizer)
    built = explain_model(workload, model)
    job = _job(workload, model)
    name = get_workload(job.workload).model_name(job)
    title = f"{spec.name} on {name} ({type(built).__name__}): analytic state per parameter (meta device)"
    return render_explain(analytic_state_map(spec, built, **optimizer_kwargs), title=title)
