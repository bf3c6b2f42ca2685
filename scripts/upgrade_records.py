"""Rewrite results files in the schema written now (optbench/records/rewrite.py says what changes and what never does).

    python scripts/upgrade_records.py                 # every *.jsonl under results/
    python scripts/upgrade_records.py FILE.jsonl ...  # these files
    python scripts/upgrade_records.py --check         # exit 1 naming every file that still holds an older line

Run it on files no sweep is writing. tests/test_rewrite.py checks the committed files, so a schema bump without
this rewrite fails CI.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optbench.records.rewrite import rewrite_file, rewritten_text  # noqa: E402


def older_lines(path: Path) -> int:
    """How many of `path`'s lines the rewrite would change."""
    return rewritten_text(path.read_text(encoding="utf-8"))[1]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    names = [arg for arg in argv if arg != "--check"]
    if unknown := [name for name in names if name.startswith("-")]:
        print(f"upgrade_records: unknown option {unknown[0]} (usage: [--check] [FILE.jsonl ...])", file=sys.stderr)
        return 2
    paths = [Path(name) for name in names] or sorted((ROOT / "results").rglob("*.jsonl"))
    if missing := [path for path in paths if not path.is_file()]:
        print(f"upgrade_records: no such file: {missing[0]}", file=sys.stderr)
        return 2
    if check:
        stale = [(path, n) for path in paths if (n := older_lines(path))]
        for path, n in stale:
            print(f"{path}: {n} line(s) in an older schema (python scripts/upgrade_records.py {path})")
        return 1 if stale else 0
    total = 0
    for path in paths:
        if count := rewrite_file(path):
            print(f"{path}: {count} line(s) rewritten")
            total += count
    print(f"{total} line(s) in {len(paths)} file(s) rewritten in the current schema")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
