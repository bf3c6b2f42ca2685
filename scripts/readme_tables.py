"""Render every results table and figure quoted in README.md and docs/ from the committed records.

Between `<!-- table: NAME -->` and `<!-- /table -->` a document holds the table NAME renders; between
`<!-- value: NAME -->` and `<!-- /value -->` one figure (a run's total minutes, a ratio). Both are rendered with the
report's own code (optbench.summary / optbench.report), so a README cell reads exactly as report.md does.

    python scripts/readme_tables.py          # rewrite README.md and docs/*.md in place
    python scripts/readme_tables.py --check  # exit 1 naming every block that differs from what the records give

tests/test_readme.py runs the check, so a table edited by hand, or records changed without regenerating, fail CI.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optbench import report  # noqa: E402
from optbench.results import Record, read_records  # noqa: E402
from optbench.summary import summarize, trials_frame  # noqa: E402

RESULTS = ROOT / "results" / "cpu-2core"
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- (table|value): ([\w.-]+) -->)(.*?)(<!-- /\2 -->)", re.S)


@dataclass(frozen=True)
class Table:
    """Columns of the report's job table (by title) for the records in `files`; `job` picks one job by a substring
    of its label when the files hold several."""

    files: tuple[str, ...]
    columns: tuple[str, ...]
    job: str = ""
    rename: dict[str, str] = field(default_factory=dict)


def _records(files: tuple[str, ...]) -> list[Record]:
    return [record for name in files for record in read_records(RESULTS / name)]


def render_table(table: Table) -> str:
    summary = summarize(trials_frame(_records(table.files)))
    for label, frame, _, _ in report.display_tables(summary):
        if table.job in label:
            missing = [c for c in table.columns if c not in frame.columns]
            if missing:
                raise KeyError(f"columns {missing} not in the report of {table.files}: {list(frame.columns)}")
            return frame[list(table.columns)].rename(columns=table.rename).to_markdown(index=False)
    raise KeyError(f"no job matching {table.job!r} in {table.files}")


def sweep_minutes(*files: str) -> str:
    """A sweep's length from its records' own stamps: the first trial's start to the last one's end."""
    records = _records(files)
    starts = [datetime.fromisoformat(r.started_at).timestamp() for r in records if r.started_at]
    ends = [datetime.fromisoformat(r.started_at).timestamp() + (r.wall_s or 0) for r in records if r.started_at]
    return f"{(max(ends) - min(starts)) / 60:.1f}"


def load_range(*files: str) -> str:
    loads = [r.env.get("load_avg_1m") for r in _records(files) if r.env.get("load_avg_1m") is not None]
    return f"{min(loads):.1f}–{max(loads):.1f}"


def commit(*files: str) -> str:
    commits = {str(r.env.get("git_commit"))[:7] for r in _records(files) if r.env.get("git_commit")}
    return ", ".join(sorted(commits))


def harness(key: str) -> str:
    """A figure of the harness-vs-bare check (`pytest benchmarks -k harness --benchmark-json`)."""
    data = json.loads((RESULTS / "harness.json").read_text())
    info = next(b["extra_info"] for b in data["benchmarks"] if b["extra_info"].get("kind") == "harness_overhead")
    return {"ratio": f"{info['harness_to_bare_ratio']:.3f}", "spread": f"{100 * info['bare_run_spread']:.1f} %",
            "pairs": "–".join(f"{r:.3f}" for r in (min(info["pair_ratios"]), max(info["pair_ratios"])))}[key]


def median_of(files: tuple[str, ...], column: str, optimizer: str, decimals: int = 1) -> str:
    frame = trials_frame(_records(files))
    values = frame[(frame["optimizer"] == optimizer) & (frame["status"] == "ok")][column].dropna()
    return f"{statistics.median(values):,.{decimals}f}"


TABLES: dict[str, Table] = {}
VALUES: dict[str, Callable[[], str]] = {}


def render(kind: str, name: str) -> str:
    if kind == "table":
        return "\n" + render_table(TABLES[name]) + "\n"
    return VALUES[name]()


def rewrite(text: str) -> tuple[str, list[str]]:
    """The document with every block re-rendered, and the names of the blocks that changed."""
    changed = []

    def one(match: re.Match) -> str:
        opening, kind, name, old, closing = match.groups()
        new = render(kind, name)
        if new != old:
            changed.append(f"{kind} {name}")
        return opening + new + closing

    return BLOCK.sub(one, text), changed


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        new, changed = rewrite(text)
        if changed and check:
            stale += [f"{path.relative_to(ROOT)}: {name}" for name in changed]
        elif changed:
            path.write_text(new, encoding="utf-8")
            print(f"readme-tables: {path.relative_to(ROOT)}: {', '.join(changed)}", file=sys.stderr)
    if stale:
        print("readme-tables: these blocks differ from what the committed records give (run "
              "scripts/readme_tables.py): " + "; ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    pd.set_option("display.width", 200)
    sys.exit(main(sys.argv[1:]))
