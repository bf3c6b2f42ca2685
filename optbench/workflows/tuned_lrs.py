"""Generate the shipped table of tuned lrs (optbench/job/tuned-lrs.json) from committed study files.

    python -m optbench.workflows.tuned_lrs results/cpu-2core/study.jsonl   # rewrite the table from these studies
    python -m optbench.workflows.tuned_lrs --check                          # regenerate from the table's own sources;
                                                                             # exit 1 when it differs from the file

Each (job, optimizer) a study tuned gets the lr its finals ran at, read from the records the way the report reads
them (report/frame.py), so the table, the report and the study agree. A job two studies tuned keeps the first
source's lr: order the sources by precedence.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from optbench.job import tuned
from optbench.records import exits
from optbench.records.record import read_records
from optbench.report.frame import trials_frame

ROOT = Path(__file__).resolve().parents[2]


def entries(study: Path, source: str) -> list[dict[str, Any]]:
    """One entry per (job, optimizer) the study finished: the lr its final trials ran at. An optimizer whose finals
    all ended at chance (report/bounds.py) gets none: the study found no lr that trains it on that job, and `run`
    then says it runs at the registry's untuned default rather than at a "tuned" lr that did not train."""
    frame = trials_frame(read_records(study))
    if frame.empty or "stage" not in frame:
        return []
    finals = frame[frame["final"] & (frame["status"] == "ok") & frame["stage"].notna()]
    found = []
    for (_, optimizer), group in finals.groupby(["job_id", "optimizer"], sort=False):
        if group["untrained"].all():
            continue
        job = {name: group["job_key"].iloc[0].get(name) for name in tuned.LR_KEY_FIELDS}
        found.append({"job": job, "optimizer": str(optimizer), "lr": float(group["lr"].iloc[-1]), "source": source})
    return found


def table_text(studies: Sequence[Path], root: Path = ROOT) -> str:
    """The table file's text for these study files (sources named relative to `root` where they lie under it)."""
    kept: dict[tuple[str, str], dict[str, Any]] = {}
    sources = []
    for study in studies:
        source = str(study.resolve().relative_to(root)) if study.resolve().is_relative_to(root) else str(study)
        sources.append(source)
        for entry in entries(study, source):
            kept.setdefault((tuned.lr_key(entry["job"]), entry["optimizer"]), entry)
    return tuned.render(list(kept.values()), sources)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    studies = [Path(a) for a in argv if a != "--check"]
    if check and not studies and tuned.TABLE.is_file():
        import json

        studies = [ROOT / s for s in json.loads(tuned.TABLE.read_text(encoding="utf-8"))["sources"]]
    missing = [str(s) for s in studies if not s.is_file()]
    if missing or not studies:
        print(f"tuned-lrs: no study file{'s' if len(missing) != 1 else ''} {', '.join(missing)}"
              if missing else "tuned-lrs: name the study files to build the table from", file=sys.stderr)
        return exits.USAGE
    try:
        text = table_text(studies)
    except ValueError as exc:  # ResultsFileError: a file that is no study's records
        print(f"tuned-lrs: {exc}", file=sys.stderr)
        return exits.USAGE
    if check:
        same = tuned.TABLE.is_file() and tuned.TABLE.read_text(encoding="utf-8") == text
        if not same:
            print(f"tuned-lrs: {tuned.TABLE} differs from what its sources give", file=sys.stderr)
        return exits.OK if same else exits.CHECK_FAILED
    tuned.TABLE.write_text(text, encoding="utf-8")
    print(f"tuned-lrs: wrote {tuned.TABLE} from {len(studies)} stud{'y' if len(studies) == 1 else 'ies'}",
          file=sys.stderr)
    return exits.OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
