"""Do two results files hold the same trials, every one `ok`? `.ci/run` asks it of a study run through the local
Slurm cluster and the same study run locally: `python scripts/same_trials.py LOCAL.jsonl CLUSTER.jsonl`.

Same trial ids means the same trials ran (a trial id hashes every setting that changes a measurement), and for a
study also that the lr walk took the same steps and chose the same lrs. Exit 0 when they match, 1 (with what
differs) when not."""

from __future__ import annotations

import sys
from pathlib import Path

from optbench.records.record import read_records


def trial_statuses(path: Path) -> dict[str, list[str]]:
    """Every trial id in the file, with the status of each of its records (more than one: it ran twice)."""
    statuses: dict[str, list[str]] = {}
    for record in read_records(path):
        statuses.setdefault(record.trial_id, []).append(record.status)
    return statuses


def differences(expected: dict[str, list[str]], got: dict[str, list[str]]) -> list[str]:
    problems = []
    if missing := sorted(set(expected) - set(got)):
        problems.append(f"missing {len(missing)} trial(s): {', '.join(missing)}")
    if extra := sorted(set(got) - set(expected)):
        problems.append(f"{len(extra)} trial(s) the other file lacks: {', '.join(extra)}")
    for name, statuses in (("first", expected), ("second", got)):
        if bad := sorted(tid for tid, seen in statuses.items() if seen != ["ok"]):
            problems.append(f"{name} file: not exactly one ok record for {', '.join(bad)}")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python scripts/same_trials.py FIRST.jsonl SECOND.jsonl", file=sys.stderr)
        return 2
    expected, got = (trial_statuses(Path(name)) for name in argv)
    problems = differences(expected, got)
    for problem in problems:
        print(f"same_trials: {problem}", file=sys.stderr)
    if not problems:
        print(f"same_trials: the same {len(got)} trials, each recorded ok once")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
