"""What `scripts/gpu-check` asserts about the records its runs wrote, beyond their exit status.

    python scripts/gpu_check_records.py RESULTS_DIR [part1|part2]    (exit 1 and one line per problem, else a count)

Every *.jsonl in RESULTS_DIR is read, keyed by its stem (smoke-all, max-memory, ...): no trial may end error or
timeout. Part 1's smoke sweep: the paged entries must have run and have their paged state counted into the peak
(bitsandbytes' cudaMallocManaged state is invisible to torch's allocator), and galore_adamw8bit (CUDA only, never
run elsewhere) must have run. Part 2: the --max-memory trial must end oom, and every ok `lm` trial must carry a
roofline share, bitsandbytes' marked host-synced. Without a part, both.
"""

from __future__ import annotations

import sys
from pathlib import Path

from optbench.probes import HOST_SYNCED
from optbench.records.record import FAILURES, Record, read_records

MUST_RUN_ON_CUDA = ("galore_adamw8bit",)  # entries that only a GPU can run: the smoke sweep must show them ok


def failures(records: dict[str, list[Record]]) -> list[str]:
    return [f"{name}: {r.optimizer} seed {r.seed} ended {r.status}: {r.error}" for name, rs in records.items()
            for r in rs if r.status in FAILURES]


def smoke_problems(records: dict[str, list[Record]]) -> list[str]:
    smoke = records.get("smoke-all", [])
    found = [] if smoke else ["smoke-all: no record"]
    paged = [r for r in smoke if r.optimizer.startswith("paged_") and r.status == "ok"]
    if not paged:
        found.append("smoke-all: no paged entry ran ok (bitsandbytes with CUDA support installed?)")
    for r in paged:
        if not r.paged_state_bytes:
            found.append(f"smoke-all: {r.optimizer} has no paged state counted (paged={r.paged}: {r.paged_reason})")
        elif r.peak_memory_bytes is None or r.peak_cuda_allocated_bytes is None or \
                r.peak_memory_bytes < r.peak_cuda_allocated_bytes + r.paged_state_bytes:
            found.append(f"smoke-all: {r.optimizer}'s peak {r.peak_memory_bytes} leaves out its paged state")
    ran = {r.optimizer: r for r in smoke}
    for name in MUST_RUN_ON_CUDA:
        if name not in ran or ran[name].status != "ok":
            why = f"ended {ran[name].status}: {ran[name].error}" if name in ran else "is not in the sweep"
            found.append(f"smoke-all: {name} {why}")
    return found


def part2_problems(records: dict[str, list[Record]]) -> list[str]:
    found = [] if records.get("max-memory") else ["max-memory: no record"]
    found += [f"max-memory: {r.optimizer} ended {r.status}, not oom" for r in records.get("max-memory", [])
              if r.status != "oom"]
    lm = [r for r in records.get("lm", []) if r.status == "ok"]
    if not lm:
        found.append("lm: no ok trial for the roofline")
    found += [f"lm: {r.optimizer} has no roofline share (bandwidth {r.device_bandwidth_bytes_per_s})" for r in lm
              if r.roofline_fraction is None]
    found += [f"lm: {r.optimizer}'s step is not marked {HOST_SYNCED!r} (impl {r.optimizer_impl!r})" for r in lm
              if r.optimizer.endswith("8bit") and r.optimizer_impl != HOST_SYNCED]
    return found


def problems(records: dict[str, list[Record]], part: str | None = None) -> list[str]:
    found = failures(records)
    if part in (None, "part1"):
        found += smoke_problems(records)
    if part in (None, "part2"):
        found += part2_problems(records)
    return found


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    part = argv[1] if len(argv) > 1 else None
    records = {path.stem: read_records(path) for path in sorted(folder.glob("*.jsonl"))}
    found = problems(records, part)
    print("\n".join(found) if found else f"checked {sum(map(len, records.values()))} records in {folder}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
