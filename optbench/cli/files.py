"""The files a command line names: the results files it reads (`load_records`) and the one it will write, checked
before any work (`check_output`). A fault in either is a usage error: one line, exit 2."""

from __future__ import annotations

from pathlib import Path

from optbench.cli.options import UsageError


def check_output(path: Path, flag: str, inputs: tuple[Path, ...] = ()) -> None:
    """A file a command will write, checked before its work (minutes of measuring, or a comparison whose exit 1 a
    late exit 2 would hide) and without making anything: a folder there, or a file where a folder must be, is
    one line now. So is a file it would overwrite that it reads (`inputs`) or that holds records: an export named
    like its results file replaced the results with the export."""
    from optbench.records.record import RECORD_START
    from optbench.records.writable import output_fault

    if fault := output_fault(path):
        raise UsageError(f"cannot write {flag} {path}: {fault}")
    if path.is_file() and any(path.samefile(given) for given in inputs if given.is_file()):
        raise UsageError(f"cannot write {flag} {path}: it is one of this command's inputs; name a new file")
    if path.is_file():
        with open(path, encoding="utf-8", errors="replace") as handle:
            holds_records = handle.read(len(RECORD_START) + 1).lstrip("\ufeff").startswith(RECORD_START)
        if holds_records:
            raise UsageError(f"cannot write {flag} {path}: it holds optbench records (a results file), which it "
                             "would overwrite; name a new file")


def load_records(files: list[Path]) -> list:
    """Every record in the results files or pytest-benchmark JSON named on the command line; a file that is not one
    is a usage error (one line), a skipped torn line a warning on stderr."""
    from optbench.records.benchjson import BenchmarkJsonError, is_benchmark_path, read_benchmark_records
    from optbench.records.record import ResultsFileError, read_records

    records = []
    for path in files:
        try:  # a torn line's warning reads `optbench: warning: ...` through main's one printer
            runs = sorted(path.glob("*.jsonl")) if path.is_dir() else []  # a folder of runs of one commit
            if path.is_dir() and not runs and not any(path.rglob("*.json")):
                raise UsageError(f"nothing to read under {path}: no results files (*.jsonl) in it and no "
                                 "pytest-benchmark JSON (*.json) under it")
            for run in runs:
                records.extend(read_records(run))
            if not runs:
                records.extend(read_benchmark_records(path) if is_benchmark_path(path) else read_records(path))
        except (ResultsFileError, BenchmarkJsonError) as exc:
            raise UsageError(str(exc)) from None
    return records
