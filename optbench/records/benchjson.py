"""Read pytest-benchmark JSON (`--benchmark-json` files, `.benchmarks/` autosaves) as optbench Records.

The benchmark suite (benchmarks/) stores Record fields in each benchmark's `extra_info` under their
Record names, plus a `kind`. All benchmarks of one optimizer in one run describe the same job and
share its trial_id, so they merge into ONE Record per optimizer and job, each kind filling what it
measures: `optimizer_step` the optimizer-step median, `train_step` the step-time median, `finetune`
the accuracy. One Record per benchmark would make the report average unlike numbers (a bare
`step()` with a whole train step) as if they were seeds. Other fields (state bytes, peak memory) come
from the most complete benchmark present: the fine-tune, else the train step, else the step alone.
With `--benchmark-save-data` the JSON also holds every timed round (`stats.data`); they become the
Record's `*_samples_s`, which `compare` tests the change against.

A folder is searched recursively for *.json, in path order; autosave names start with a counter
(0001_, 0002_, ...), so a later run of the same job replaces an earlier one in the report, as a re-run
trial does in a results file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from optbench.records.fields import RecordFieldError
from optbench.records.record import MACHINE_KEYS, Record

# kind -> the Record fields its stats median, IQR and raw rounds fill (None: the Record already holds them)
TIMED_FIELDS: dict[str, tuple[str, str, str] | None] = {
    "finetune": None,
    "train_step": ("step_time_median_s", "step_time_iqr_s", "step_time_samples_s"),
    "optimizer_step": ("optimizer_step_median_s", "optimizer_step_iqr_s", "optimizer_step_samples_s"),
}
# machine_info keys (set by benchmarks/conftest.py) copied into Record.env


class BenchmarkJsonError(ValueError):
    """A path that is not pytest-benchmark JSON (or a folder without any); the message names the file."""


def is_benchmark_path(path: Path) -> bool:
    """True for what this module reads: a .json file or a folder (results files are .jsonl)."""
    return path.is_dir() or path.suffix.lower() == ".json"


def read_benchmark_records(path: Path) -> list[Record]:
    """Records from one pytest-benchmark JSON file, or from every *.json under a folder."""
    if path.is_dir():
        files = sorted(path.rglob("*.json"))
        if not files:
            raise BenchmarkJsonError(f"no pytest-benchmark *.json files under {path}")
    elif path.is_file():
        files = [path]
    else:
        raise BenchmarkJsonError(f"no such benchmark file: {path}")
    return [record for file in files for record in records_from_document(_load(file), file)]


def _load(file: Path) -> dict[str, Any]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BenchmarkJsonError(f"{file}: not a JSON file ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise BenchmarkJsonError(f"{file}: not pytest-benchmark JSON (no 'benchmarks' list)")
    return data


def records_from_document(data: dict[str, Any], source: Path) -> list[Record]:
    """One Record per trial_id among the benchmarks that carry optbench extra_info; others are ignored."""
    by_trial: dict[str, dict[str, dict[str, Any]]] = {}
    for bench in data["benchmarks"]:
        info = bench.get("extra_info") if isinstance(bench, dict) else None
        if not isinstance(info, dict) or not isinstance(info.get("kind"), str) or info["kind"] not in TIMED_FIELDS \
                or not isinstance(info.get("trial_id"), str) or not info["trial_id"]:
            continue
        if not isinstance(info.get("optimizer"), str) or not info["optimizer"]:  # as a results line without one
            raise BenchmarkJsonError(f"{source}: benchmark {bench.get('name')!r} is not an optbench benchmark "
                                     "(its extra_info names no optimizer)")
        stats = bench.get("stats")
        median = stats.get("median") if isinstance(stats, dict) else None
        if not isinstance(median, int | float) or isinstance(median, bool) or not median > 0:
            raise BenchmarkJsonError(f"{source}: benchmark {bench.get('name')!r} has no positive stats.median")
        by_trial.setdefault(info["trial_id"], {})[info["kind"]] = bench
    try:
        return [_merge(kinds, data) for kinds in by_trial.values()]
    except RecordFieldError as exc:
        raise BenchmarkJsonError(f"{source}: a benchmark's extra_info: {exc}") from None


def _merge(kinds: dict[str, dict[str, Any]], data: dict[str, Any]) -> Record:
    ordered = [kinds[kind] for kind in TIMED_FIELDS if kind in kinds]  # most complete first
    merged: dict[str, Any] = {}
    for bench in ordered:
        for key, value in bench["extra_info"].items():
            if merged.get(key) is None:
                merged[key] = value
    record = Record.from_dict(merged)
    for kind, fields in TIMED_FIELDS.items():
        if fields is not None and kind in kinds:
            stats = kinds[kind]["stats"]
            setattr(record, fields[0], stats["median"])
            iqr = stats.get("iqr")
            setattr(record, fields[1], iqr if isinstance(iqr, int | float) and not isinstance(iqr, bool) else None)
            setattr(record, fields[2], _rounds(stats))
    if record.step_time_median_s and record.batch_size:
        record.samples_per_s = record.batch_size / record.step_time_median_s
    failed = [b["extra_info"] for b in ordered if b["extra_info"].get("status", "ok") != "ok"]
    record.status, record.error = (failed[0]["status"], failed[0].get("error")) if failed else ("ok", None)
    record.run_id = record.started_at = str(data.get("datetime", ""))
    record.env = _environment(data)
    return record


def _rounds(stats: dict[str, Any]) -> list[float]:
    """The timed rounds, present only when the run used --benchmark-save-data; compare tests against them."""
    data = stats.get("data")
    if not isinstance(data, list) or not all(isinstance(v, int | float) for v in data):
        return []
    return [float(v) for v in data]


def _environment(data: dict[str, Any]) -> dict[str, Any]:
    machine = data.get("machine_info") if isinstance(data.get("machine_info"), dict) else {}
    commit = data.get("commit_info") if isinstance(data.get("commit_info"), dict) else {}
    cpu = machine.get("cpu") if isinstance(machine.get("cpu"), dict) else {}
    env = {key: machine.get(key) for key in MACHINE_KEYS}
    env.update(python=machine.get("python_version"), cpu=cpu.get("brand_raw"), cpu_count=cpu.get("count"),
               git_commit=commit.get("id"),
               source="pytest-benchmark")
    return env
