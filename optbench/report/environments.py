"""Whether two runs' numbers are like with like: the commits they were measured at, the environment keys that
change what a number means (machine, library versions, threads), whether a run was timed on a busy machine, and
whether an optimizer trained at another lr. `compare` puts all four in its header; `--strict-env` refuses unlike
environments."""

from __future__ import annotations

from optbench.records.record import MACHINE_KEYS, Record
from optbench.report.frame import job_id

# Environment keys that change what a number means: (where, key). "record" is a Record field, "env" its stamp.
ENV_KEYS = (("record", "device_name"), ("env", "cpu"), ("env", "cpu_count"), *(("env", key) for key in MACHINE_KEYS))


def _stamp(records: list[Record], where: str, key: str) -> set[str] | None:
    """The values a run shows for one key (None: a library stamped as not installed); None when no record
    of the run carries the key at all (an older file), so there is nothing to compare."""
    if where == "record":
        return {str(getattr(r, key)) for r in records if getattr(r, key)} or None
    present = [r.env[key] for r in records if key in r.env]
    return {str(value) for value in present} if present else None


def run_commits(records: list[Record]) -> list[str]:
    """The git commits a run's records were measured at, in first-seen order."""
    return list(dict.fromkeys(str(r.env["git_commit"]) for r in records if r.env.get("git_commit")))


def environment_differences(base: list[Record], new: list[Record]) -> list[str]:
    """One line per environment key whose values differ between the runs (keys one run lacks are skipped)."""
    lines = []
    for where, key in ENV_KEYS:
        before, after = _stamp(base, where, key), _stamp(new, where, key)
        if before is not None and after is not None and before != after:
            lines.append(f"{key}: {', '.join(sorted(before))} → {', '.join(sorted(after))}")
    return lines


BUSY_LOAD_PER_CORE = 1.5  # one sweep keeps the load near the core count; well above it, others shared the CPUs


def busy_machine(records: list[Record], name: str) -> str | None:
    """A warning when a run's trials were stamped with a 1-minute load above BUSY_LOAD_PER_CORE x cores:
    its times include neighbours' work (back-to-back runs here moved +50 % and more at load 15-20)."""
    loads = [(r.env["load_avg_1m"], r.env.get("cpu_count") or 1) for r in records
             if isinstance(r.env.get("load_avg_1m"), int | float)]
    busy = [load for load, cores in loads if load > BUSY_LOAD_PER_CORE * cores]
    if not busy:
        return None
    cores = max(c for _, c in loads)
    return (f"{name} was timed on a busy machine (1-minute load up to {max(busy):.1f} on {cores} cores in "
            f"{len(busy)} of {len(loads)} trials): its times include other work")


def lr_differences(base: list[Record], new: list[Record]) -> list[str]:
    """Per job and optimizer both runs trained ok, a warning where its lr differs. The job key leaves the lr out
    (each optimizer has its own), so a run at a study's tuned lr and one at the registry's default compare as one
    job, and a change between them is the lr's as much as the code's."""
    def lrs(records: list[Record]) -> dict[tuple[str, str], set[float]]:
        found: dict[tuple[str, str], set[float]] = {}
        for record in records:
            if record.status == "ok":
                found.setdefault((job_id(record.job_key), record.optimizer), set()).add(record.lr)
        return found

    before, after = lrs(base), lrs(new)
    shown = {pair: [", ".join(f"{lr:g}" for lr in sorted(run[pair])) for run in (before, after)]
             for pair in before if pair in after and before[pair] != after[pair]}
    return [f"{optimizer} trained at lr {old} in BASE and {now} in NEW: its changes are the lr's as much as the code's"
            for (_, optimizer), (old, now) in shown.items()]
