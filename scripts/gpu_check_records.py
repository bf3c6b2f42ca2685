"""What `scripts/gpu-check` asserts about the records its runs wrote, beyond their exit status.

    python scripts/gpu_check_records.py RESULTS_DIR    (exit 1 and one line per problem, else a count)

Every *.jsonl in RESULTS_DIR is read, keyed by its stem (smoke-all, max-memory, ...): no trial may end error or
timeout; the paged entries of the smoke sweep must have run and have their paged state counted into the peak
(bitsandbytes' cudaMallocManaged state is invisible to torch's allocator); the --max-memory trial must end oom.
"""

from __future__ import annotations

import sys
from pathlib import Path

from optbench.records.record import Record, read_records


def problems(records: dict[str, list[Record]]) -> list[str]:
    found = [f"{name}: {r.optimizer} seed {r.seed} ended {r.status}: {r.error}" for name, rs in records.items()
             for r in rs if r.status in ("error", "timeout")]
    paged = [r for r in records.get("smoke-all", []) if r.optimizer.startswith("paged_") and r.status == "ok"]
    if not paged:
        found.append("smoke-all: no paged entry ran ok (bitsandbytes with CUDA support installed?)")
    for r in paged:
        if not r.paged_state_bytes:
            found.append(f"smoke-all: {r.optimizer} has no paged state counted (paged={r.paged}: {r.paged_reason})")
        elif r.peak_memory_bytes is None or r.peak_cuda_allocated_bytes is None or \
                r.peak_memory_bytes < r.peak_cuda_allocated_bytes + r.paged_state_bytes:
            found.append(f"smoke-all: {r.optimizer}'s peak {r.peak_memory_bytes} leaves out its paged state")
    if not records.get("max-memory"):
        found.append("max-memory: no record")
    found += [f"max-memory: {r.optimizer} ended {r.status}, not oom" for r in records.get("max-memory", [])
              if r.status != "oom"]
    return found


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    records = {path.stem: read_records(path) for path in sorted(folder.glob("*.jsonl"))}
    found = problems(records)
    print("\n".join(found) if found else f"checked {sum(map(len, records.values()))} records in {folder}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
