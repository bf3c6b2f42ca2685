"""Run a sweep: one fresh subprocess per trial, with a timeout, appending each record as it lands.

A fresh process per trial keeps peak-memory readings comparable (nothing left over from the previous
optimizer) and contains crashes: a segfault, an OOM kill or a hang becomes a record with a status.
Trials already recorded `ok` in the output file are skipped, so re-running a killed sweep resumes it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from optbench.plan import TrialSpec
from optbench.results import Record, append_record, completed_trial_ids

STDERR_TAIL_BYTES = 4096


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]


def _forward_stderr(fd: int, tail: bytearray) -> None:
    """Echo the child's stderr as it comes (its progress bar redraws with \r, not newlines) and keep
    the last few KiB for the error message of a child that dies without writing its record."""
    out = getattr(sys.stderr, "buffer", None)
    while chunk := os.read(fd, 4096):
        if out is not None:
            out.write(chunk)
            out.flush()
        tail.extend(chunk)
        del tail[:-STDERR_TAIL_BYTES]


def _last_lines(tail: bytes, count: int = 3) -> str:
    lines = [line.strip() for line in tail.decode(errors="replace").replace("\r", "\n").splitlines()]
    return " | ".join([line for line in lines if line][-count:]) or "no output"


def _failed(spec: TrialSpec, status: str, error: str) -> Record:
    from optbench.trial import record_from_spec  # imports torch: only needed when a child failed

    record = record_from_spec(spec)
    record.status, record.error = status, error
    return record


def run_in_subprocess(spec: TrialSpec) -> Record:
    """Run `python -m optbench.trial` on `spec`; a timeout or crash becomes a record with that status."""
    with tempfile.TemporaryDirectory(prefix="optbench-") as tmp:
        spec_path, record_path = Path(tmp) / "spec.json", Path(tmp) / "record.json"
        spec_path.write_text(json.dumps(spec.to_dict()))
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-m", "optbench.trial", str(spec_path), str(record_path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, so a timeout kills any grandchildren too
            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
        )
        tail = bytearray()
        reader = threading.Thread(target=_forward_stderr, args=(child.stderr.fileno(), tail), daemon=True)
        reader.start()
        try:
            returncode = child.wait(timeout=spec.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            reader.join(timeout=5)
            record = _failed(spec, "timeout", f"trial exceeded its {spec.timeout_s:g} s timeout")
            record.wall_s = time.perf_counter() - started
            return record
        reader.join(timeout=5)
        if record_path.is_file():
            return Record.from_dict(json.loads(record_path.read_text()))
        last = _last_lines(bytes(tail))
        if returncode in (-signal.SIGKILL, 137):
            record = _failed(spec, "oom", f"trial process was killed (out of memory?): {last}")
        else:
            record = _failed(spec, "error", f"trial process exited with code {returncode}: {last}")
        record.wall_s = time.perf_counter() - started
        return record


def run_sweep(specs: list[TrialSpec], out_path: Path, run_id: str | None = None,
              run_trial: Callable[[TrialSpec], Record] = run_in_subprocess,
              on_record: Callable[[Record], None] | None = None) -> list[Record]:
    """Run every spec not already `ok` in `out_path`, appending each record as soon as it exists."""
    run_id = run_id or new_run_id()
    done = completed_trial_ids(out_path)
    records = []
    for spec in specs:
        if spec.trial_id in done:
            if on_record is not None:
                on_record(_skipped_note(spec))
            continue
        record = run_trial(spec)
        record.run_id = run_id
        append_record(out_path, record)
        records.append(record)
        if on_record is not None:
            on_record(record)
    return records


def _skipped_note(spec: TrialSpec) -> Record:
    """A record for display only (never stored): this trial is already recorded ok."""
    return Record(trial_id=spec.trial_id, status="skipped", optimizer=spec.optimizer, seed=spec.seed,
                  workload=spec.workload, error="already recorded ok in this results file")
