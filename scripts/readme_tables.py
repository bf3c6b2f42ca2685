"""Render every results table and figure quoted in README.md and docs/ from the committed records.

Between `<!-- table: NAME -->` and `<!-- /table -->` a document holds the table NAME renders; between
`<!-- value: NAME -->` and `<!-- /value -->` one figure (a run's total minutes, a ratio). Both are rendered with the
report's own code (optbench.report.frame / optbench.report.render), so a README cell reads exactly as report.md does.

    python scripts/readme_tables.py          # rewrite README.md and docs/*.md in place
    python scripts/readme_tables.py --check  # exit 1 naming every block that differs from what the records give

tests/test_readme.py runs the check, so a table edited by hand, or records changed without regenerating, fail CI.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))  # readme_gpu beside this file

from readme_gpu import gpu_folders, gpu_section  # noqa: E402

from optbench.optimizers.noise import filter_known_noise  # noqa: E402
from optbench.records.record import SCHEMA_VERSION, Record, read_records  # noqa: E402
from optbench.report import metrics  # noqa: E402
from optbench.report import render as report  # noqa: E402
from optbench.report.frame import latest_per_trial, summarize, trials_frame  # noqa: E402

RESULTS = ROOT / "results" / "cpu-2core"
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- (table|value): ([\w.-]+) -->)(.*?)(<!-- /\2 -->)", re.S)


@dataclass(frozen=True)
class Table:
    """Columns of the report's job table (by title) for the records in `files`; `job` picks one job by a substring
    of its label when the files hold several."""

    files: tuple[str, ...]
    columns: tuple[str, ...]
    job: str = ""
    rename: dict[str, str] = field(default_factory=dict)
    # shown where the records fill them, in the order of `columns` (listed there too): the roofline columns, which
    # records without a bandwidth calibration leave empty
    optional: tuple[str, ...] = ()


class NotMeasured(LookupError):
    """A records file a block reads is not there yet (a design changed and its reference step has not re-run)."""


def _records(files: tuple[str, ...]) -> list[Record]:
    missing = [name for name in files if not (RESULTS / name).is_file()]
    if missing:
        raise NotMeasured(", ".join(missing))
    return [record for name in files for record in read_records(RESULTS / name)]


def current_lm(records: list[Record], name: str) -> list[Record]:
    """The records, unless they are of an LM workload's earlier model (its figures mean another model and corpus)."""
    from optbench.job.spec import TrialSpec
    from optbench.workloads import get_workload

    current = get_workload("lm").model_name(TrialSpec("adamw", workload="lm"))
    stale = sorted({r.model for r in records if r.workload == "lm" and r.model.startswith("llama-")} - {current})
    if stale:
        raise NotMeasured(f"{name} records of the current LM, {current} (it holds {', '.join(stale)}),")
    return records


def render_table(table: Table) -> str:
    summary = summarize(trials_frame(current_lm(_records(table.files), ", ".join(table.files))))
    for label, frame, _, _ in report.display_tables(summary):
        if table.job in label:
            missing = [c for c in table.columns if c not in frame.columns and c not in table.optional]
            if missing:
                raise KeyError(f"columns {missing} not in the report of {table.files}: {list(frame.columns)}")
            shown = [c for c in table.columns if c in frame.columns]
            return frame[shown].rename(columns=table.rename).to_markdown(index=False)
    raise KeyError(f"no job matching {table.job!r} in {table.files}")


def sweep_minutes(*files: str) -> str:
    """A sweep's length from its records' own stamps: the first trial's start to the last one's end."""
    records = _records(files)
    starts = [datetime.fromisoformat(r.started_at).timestamp() for r in records if r.started_at]
    ends = [datetime.fromisoformat(r.started_at).timestamp() + (r.wall_s or 0) for r in records if r.started_at]
    return f"{(max(ends) - min(starts)) / 60:.1f}"


def registry_entries() -> str:
    """The registry's size from the package itself (not from records: it is code, and the intro must not drift from
    it), and how many of HF Trainer's `optim` names it covers."""
    from transformers.training_args import OptimizerNames

    from optbench import optimizers

    def known(name: str) -> bool:
        try:
            return bool(optimizers.resolve(name))
        except optimizers.UnknownOptimizerError:
            return False

    entries = optimizers.REGISTRY.values()
    names = [member.value for member in OptimizerNames]
    covered = sum(map(known, names))
    return (f"{len(entries)} entries from {len({spec.library for spec in entries})} libraries, covering {covered} "
            f"of the {len(names)} `optim` names HF Trainer accepts")


def results_files() -> list[Path]:
    """Every results file under results/cpu-2core, then under each GPU folder scripts/gpu-check wrote: the records
    (*.jsonl) and the stamped JSON documents (the harness check's pytest-benchmark file, the bare-loop probe, a
    bandwidth calibration)."""
    folders = [RESULTS, *gpu_folders(RESULTS.parent)]
    return [path for folder in folders for path in sorted([*folder.rglob("*.jsonl"), *folder.rglob("*.json")])]


def _stamps(path: Path) -> list[dict]:
    """The environment stamps one results file carries: each record's, or a JSON document's own."""
    if path.suffix == ".jsonl":
        return [r.env for r in read_records(path)]
    data = json.loads(path.read_text())
    if "commit_info" in data:  # pytest-benchmark: the commit from pytest-benchmark, the rest from machine_info
        info, machine = data["commit_info"], data.get("machine_info", {})
        cpu = machine.get("cpu") if isinstance(machine.get("cpu"), dict) else {}
        return [{"git_commit": info.get("id"), "git_dirty": info.get("dirty"),
                 "load_avg_1m": machine.get("load_avg_1m"), "cpu": cpu.get("brand_raw"),
                 "cpu_model": machine.get("cpu_model"), "cpu_capability": machine.get("cpu_capability"),
                 "gpu": machine.get("gpu")}]
    return [data["env"]] if isinstance(data.get("env"), dict) else []


def _shown(values: list, fmt: str = "{}") -> str:
    return ", ".join(fmt.format(v) for v in dict.fromkeys(values)) or "not stamped"


def _host(stamp: dict) -> str:
    """The CPU a stamp was measured on, short: vendor and family/model (`AMD EPYC 25/1`, `Intel Xeon 6/167`)."""
    vendor = " ".join(word for word in str(stamp["cpu"]).replace("(R)", "").split() if word != "Processor")
    model = re.findall(r"\d+", str(stamp.get("cpu_model") or ""))[:2]
    host = f"{vendor} {'/'.join(model)}".strip()
    return f"{stamp['gpu']} ({host})" if stamp.get("gpu") else host


def provenance_table() -> str:
    """Per results file: how many stamps it holds, the commit(s) it was measured at, whether the checkout was dirty,
    the 1-minute load while it was measured (above the two cores, neighbours shared the machine) and the CPU (the
    2-core machines this project is measured on are not always the same host: timings compare within one file)."""
    groups: dict[str, list[dict]] = {}
    for path in results_files():
        run = path.stem.startswith("run-")  # one of a campaign's runs: one row per folder of them
        shown = path.parent / f"run-*{path.suffix}" if run else path
        name = str(shown.relative_to(RESULTS if shown.is_relative_to(RESULTS) else ROOT))
        groups.setdefault(name, []).extend(_stamps(path))
    rows = []
    for name, stamps in groups.items():
        if not stamps:
            continue
        loads = [s["load_avg_1m"] for s in stamps if isinstance(s.get("load_avg_1m"), int | float)]
        dirty = [{True: "dirty", False: "clean"}.get(s.get("git_dirty"), "not stamped") for s in stamps]
        rows.append({"results file": name, "stamps": len(stamps),
                     "commit": _shown([str(s["git_commit"])[:7] for s in stamps if s.get("git_commit")], "`{}`"),
                     "tree": _shown(dirty),
                     "1-min load": f"{min(loads):.1f}–{max(loads):.1f}" if loads else "not stamped",
                     "cpu": _shown([_host(s) for s in stamps if s.get("cpu")])})
    return pd.DataFrame(rows).to_markdown(index=False)


def hosts() -> str:
    """The 2-core hosts the CPU records were measured on, most stamps first, each with torch's CPU kernels: the
    machine is not always the same host, so a sentence naming one would be wrong for the others."""
    counts: dict[str, int] = {}
    for path in results_files():
        if path.is_relative_to(RESULTS):
            for stamp in _stamps(path):
                if stamp.get("cpu"):
                    host = f"{_host(stamp)} ({stamp.get('cpu_capability') or 'kernels not stamped'})"
                    counts[host] = counts.get(host, 0) + 1
    ranked = sorted(counts.items(), key=lambda item: -item[1])
    return "; ".join(f"{host}, {n} stamps" for host, n in ranked)


def _where(stamps: list[dict]) -> str:
    """The commit(s) and host(s) a file's stamps name: `at `abc1234` on AMD EPYC 25/17`."""
    return f"at {_shown([str(s['git_commit'])[:7] for s in stamps if s.get('git_commit')], '`{}`')} on " \
           f"{_shown([_host(s) for s in stamps if s.get('cpu')])}"


def harness_where(name: str) -> str:
    """The commit and host a pytest-benchmark file was measured at, from its own stamp."""
    if not (RESULTS / name).is_file():
        raise NotMeasured(name)
    return _where(_stamps(RESULTS / name))


def harness_summary(name: str = "harness.json") -> str:
    """The harness-vs-bare check's figure (`pytest benchmarks -k harness --benchmark-json`), published only where
    its interval resolved the tolerance."""
    data = json.loads((RESULTS / name).read_text())
    info = next(b["extra_info"] for b in data["benchmarks"] if b["extra_info"].get("kind") == "harness_overhead")
    ratio, tolerance, pairs = info["harness_to_bare_ratio"], info["tolerance"], info["pair_ratios"]
    low, high, verdict = info.get("ratio_low"), info.get("ratio_high"), info.get("resolution")
    interval = f"95 % CI {low:.3f}–{high:.3f} over {len(pairs)} pairs" if low is not None else \
        f"{len(pairs)} pairs, measured before the check computed an interval"
    spread = f"bare runs' spread {info['bare_run_spread']:.1%}"
    if verdict == "within":
        return f"harness / bare {ratio:.3f}, {interval}: within the ±{tolerance:.0%} tolerance ({spread})"
    if verdict == "outside":
        return f"harness / bare {ratio:.3f}, {interval}: OUTSIDE the ±{tolerance:.0%} tolerance ({spread})"
    return f"unmeasured — harness / bare {ratio:.3f}, {interval}, which does not resolve ±{tolerance:.0%} ({spread})"


def harness_factors_table() -> str:
    """scripts/harness_factors.py: each part of a trial's preamble (and the harness) against a bare loop."""
    path = RESULTS / "harness-factors.json"
    if not path.is_file():
        return "not measured yet"
    data = json.loads(path.read_text())
    rows = [{"bare loop and": name, "step / bare step": f"{found['ratio']:.3f}",
             "95 % CI": "n/a" if found["low"] is None else f"{found['low']:.3f}–{found['high']:.3f}"}
            for name, found in data["ratio_to_bare"].items()]
    return (pd.DataFrame(rows).to_markdown(index=False) + f"\n\n{data['rounds']} rounds, {data['threads']} "
            "thread(s), every variant once per round in a rotating order")


def side_by_side(*files: str) -> str:
    """The report's side-by-side table (jobs differing only in precision or engine), without its heading."""
    text = report.render_side_by_side_markdown(summarize(trials_frame(current_lm(_records(files), ", ".join(files)))))
    return "\n".join(line for line in text.strip().splitlines() if not line.startswith("###")).strip()


def per_rank(*files: str) -> str:
    from optbench.trial.engines.parallel import per_rank_markdown

    return per_rank_markdown(_records(files)).strip()


def sharding_table(*files: str) -> str:
    """The sharding check (`reference-results sharding`): per optimizer and mode, the parameters compared and those
    whose state changed precision or bytes per element, then each changed parameter."""
    from optbench.memory.sharding import changes_markdown

    present = [name for name in files if (RESULTS / name).exists()]
    if not present:
        return "(not run yet: `scripts/reference-results sharding`)"
    return changes_markdown(_records(tuple(present))).strip()


def errors(*files: str) -> str:
    """The failed rows' messages, one bullet each (what the library said)."""
    lines = [_failed(r) for r in latest_per_trial(_records(files)) if r.status != "ok"]
    return "\n".join(lines) or "(every trial ran)"


def _failed(record: Record) -> str:
    return f"- {record.optimizer} ({record.status}): {record.error}"


def resume_errors(*files: str) -> str:
    """Every row that did not resume exactly, with the reason: a failed trial's message or the resume status."""
    lines = [_failed(r) if r.status != "ok" else f"- {r.optimizer}: {r.resume_status}"
             for r in latest_per_trial(_records(files)) if r.status != "ok" or r.resume_status != "exact"]
    return "\n".join(lines) or "(every entry resumed exactly)"


def spread_pts(file: str, optimizer: str | None = None) -> str:
    """Max minus min of the target metric over the seeds, in points; in a study, `optimizer`'s seeds at the lr its
    finals ran at (the tune trial at that lr is seed 0's final)."""
    records = [r for r in _records((file,)) if r.status == "ok" and optimizer in (None, r.optimizer)]
    final_lrs = {r.lr for r in records if r.stage == "final"}
    values = [r.eval_metrics[r.target_metric] for r in records if not final_lrs or r.lr in final_lrs]
    return f"{100 * (max(values) - min(values)):.1f}"


def design_table() -> str:
    """The pilot that chose the study's job (`reference-results design`): per job, AdamW's seeds and how far apart
    two runs of one seed end when only the rounding differs (AdamW against its fused kernel): the noise floor of a
    paired difference, and the minimum detectable difference a candidate that tracked AdamW that closely would get
    at the study's six seeds."""
    from optbench.report import stats

    rows = []
    for batch in (16, 64):
        records = [r for r in _records((f"design/batch-{batch}.jsonl",)) if r.status == "ok"]
        accuracy = {(r.optimizer, r.seed): 100 * r.eval_accuracy for r in records}
        seeds = sorted(seed for name, seed in accuracy if name == "adamw" and ("adamw_fused", seed) in accuracy)
        adamw = [accuracy["adamw", seed] for seed in seeds]
        pairs = [accuracy["adamw_fused", seed] - accuracy["adamw", seed] for seed in seeds]
        sd = statistics.stdev(pairs)
        job = records[0]
        rows.append({"job": f"{job.steps} steps x batch {job.batch_size}", "seeds": len(seeds),
                     "AdamW accuracy % per seed": ", ".join(f"{a:.1f}" for a in adamw),
                     "AdamW seed SD pts": f"{statistics.stdev(adamw):.2f}",
                     "fused - AdamW pts per seed": ", ".join(f"{d:+.2f}" for d in pairs),
                     "paired SD pts": f"{sd:.2f}",
                     "MDD at n=6 pts": f"{stats.minimum_detectable_difference(sd, 6, 1.0):.2f}",
                     "ceiling": f"{job.metric_ceiling:.4f}"})
    return pd.DataFrame(rows).to_markdown(index=False)


def bound(file: str, field: str, decimals: int = 4) -> str:
    """The metric's ceiling (floor) or chance its records agree on (report/bounds.py), as the report prints it."""
    from optbench.report.bounds import single

    value = single(getattr(r, field) for r in current_lm(_records((file,)), file) if r.status == "ok")
    return "unknown" if value is None else f"{value:,.{decimals}f}"


def run_vs_study() -> str:
    """Each optimizer's one-seed `run` of the default job against the mean of its study finals, in points: what a
    user's first command gets at the tuned lr, next to what the study says to expect."""
    run = trials_frame(_records(("default.jsonl",)))
    study = trials_frame(_records(("study.jsonl",)))
    finals = study[study["final"] & (study["status"] == "ok")].groupby("optimizer")["eval_target"].mean()
    said = [f"{row.optimizer} {100 * (row.eval_target - finals[row.optimizer]):+.1f}"
            for row in run[run["status"] == "ok"].itertuples() if row.optimizer in finals]
    return ", ".join(said) + " points"


def power_cost(candidate: str, target_pts: float = 2.0, study_file: str = "study.jsonl") -> str:
    """What a minimum detectable difference of `target_pts` against AdamW would take at the committed study's own
    paired spread: the SD of the seed-paired differences, the smallest n whose MDD reaches the target, and that many
    seeds' final trials of both arms at their median measured wall time (the tune stage not counted)."""
    from optbench.report import stats
    from optbench.report.frame import per_seed

    study = trials_frame(_records((study_file,)))
    finals = study[study["final"] & (study["status"] == "ok")]
    differences = stats.oriented_differences(per_seed(finals, candidate), per_seed(finals, "adamw"), "max",
                                             stats.POINTS)
    sd = statistics.stdev(differences)
    margin = stats.DEFAULT_MARGIN[stats.POINTS]
    n = next((n for n in range(2, stats.MAX_SEEDS + 1)
              if stats.minimum_detectable_difference(sd, n, margin) <= target_pts), None)
    if n is None:
        return f"paired SD {sd:.2f} pts: more than {stats.MAX_SEEDS} seeds"
    pair_s = sum(finals[finals["optimizer"] == name]["wall_s"].median() for name in (candidate, "adamw"))
    return (f"paired SD {sd:.2f} pts over {len(differences)} seeds; an MDD of {target_pts:g} pts needs n = {n} "
            f"seeds, {n * pair_s / 60:.0f} minutes of final trials for the two arms alone "
            f"({pair_s:.0f} s per seed pair)")


def explain(optimizer: str) -> str:
    from optbench.memory import statemap

    return "\n" + statemap.explain(optimizer).strip() + "\n"


def command_output(*argv: str) -> str:
    """A command as the docs show it, `$ python -m optbench ...` and what it prints, run here (no records: the
    answer depends only on the registry and the code)."""
    import contextlib
    import io

    from optbench.__main__ import main

    printed = io.StringIO()
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(printed):  # paths as the docs type them
        assert main(list(argv)) == 0, argv
    return f"```text\n$ python -m optbench {' '.join(argv)}\n{printed.getvalue().strip()}\n```"


ESTIMATE_SHOWN = "adamw,adafactor,adamw8bit,adamw8bit_torchao,adamw4bit_torchao"


def predictor_band() -> str:
    """The held-out trials' error from their own recorded predictions (what each trial predicted before it ran)."""
    from optbench.memory import coverage

    held = current_lm(_records(("predictor/held-out.jsonl",)), "predictor/held-out.jsonl")
    return coverage.own_band(held).describe()


def predictor_coverage(part: str) -> str:
    """The held-out margin's coverage on fresh trials of other shapes (optbench/memory/coverage.py)."""
    from optbench.memory import coverage

    text, found = coverage.report(*(_records((f"predictor/{name}.jsonl",))
                                    for name in ("calibration", "held-out", "fresh")))
    return found.describe() if part == "summary" else found.table.sort_values(
        ["workload", "optimizer", "batch", "seq"]).to_markdown(index=False, floatfmt=".1f")


def first_fresh_coverage() -> str:
    """The first fresh set's verdict as its step wrote it then (share-only margin), kept under earlier/: the rule
    was changed after it, so it is history, not re-scored with today's rule."""
    written = (RESULTS / "earlier" / "predictor-fresh-1" / "coverage.md").read_text().split("\n\n")
    return next(part for part in written if part.startswith("coverage "))


FIT_BUDGET = "1.5GiB"  # what `reference-results fit` passes to `optbench fit --memory`


def fit_table() -> str:
    """`optbench fit`'s table, rebuilt from its trials' records (fit.jsonl), so a record changed shows here."""
    from optbench.memory import fit
    from optbench.memory.estimate import parse_bytes

    result = fit.result_from_records(_records(("fit.jsonl",)), parse_bytes(FIT_BUDGET))
    return fit.fit_table(result).to_markdown(index=False, floatfmt=".1f")


HARNESS_REPEAT = "harness-repeat/harness.json"  # reference-results harness-repeat: the check alone, again
FIT_RUNS = ("fit.jsonl", "fit-repeat/run-1.jsonl", "fit-repeat/run-2.jsonl")  # the fit step's, then fit-repeat's


def fit_repeat() -> str:
    """The fit step's command, run more than once: each run's answers with its commit and host, and how far the
    answers moved between the runs, in steps of fit's batch grid (`fit.candidate_sizes`): over all runs, and
    between the repeats alone (one commit, one host)."""
    from optbench.memory import fit
    from optbench.memory.estimate import parse_bytes

    runs, answers = [], {}
    for name in FIT_RUNS:
        records = _records((name,))
        growths = fit.result_from_records(records, parse_bytes(FIT_BUDGET)).growths
        sizes = ", ".join(f"{opt} {growth.size}" for opt, growth in growths.items())
        runs.append(f"{_where([r.env for r in records if r.env])}: {sizes}")
        for opt, growth in growths.items():
            answers.setdefault(opt, []).append(growth.size)
    grid = fit.candidate_sizes("batch", max(size or 0 for sizes in answers.values() for size in sizes))

    def spread(sizes: list[int | None]) -> str:
        if None in sizes:
            return "no answer in a run"
        steps = grid.index(max(sizes)) - grid.index(min(sizes))
        return f"{steps} grid step{'' if steps == 1 else 's'} ({max(sizes) - min(sizes)})"

    everything = "; ".join(f"{opt} {spread(sizes)}" for opt, sizes in answers.items())
    repeats = "; ".join(f"{opt} {spread(sizes[1:])}" for opt, sizes in answers.items())
    return (f"{len(FIT_RUNS)} runs of `fit --memory {FIT_BUDGET}`: {'; '.join(runs)}. The answers spread by "
            f"{everything} over all {len(FIT_RUNS)}, and by {repeats} between the last {len(FIT_RUNS) - 1}")


ROOFLINE_AGREEMENT = 0.05  # five trials of one kernel must each read within ±5 % of their median


def new_entries() -> str:
    """The smoke run of every runnable entry HF's optim names brought: how many ran, how many held exactly the
    analytic state, and how each resumed from its step-4 checkpoint."""
    records = _records(("new-entries.jsonl", "new-entries-trainer.jsonl"))
    ok = [r for r in records if r.status == "ok"]
    exact = sum(r.state_bytes == r.analytic_state_bytes for r in ok)
    resumed = Counter(str(r.resume_status) for r in ok)
    said = ", ".join(f"{count} {status}" for status, count in resumed.most_common())
    odd = ", ".join(sorted(r.optimizer for r in ok if r.resume_status not in ("exact", "close")))
    return (f"{len(ok)} of {len(records)} ok, {exact} of them holding exactly the analytic state; resumed from step 4: "
            f"{said}" + (f" ({odd})" if odd else ""))


def stray_from_median(values: list[float]) -> float:
    """How far the farthest value lies from their median, as a fraction of it: the ±x % a set of trials agrees to."""
    middle = statistics.median(values)
    return max(abs(value / middle - 1) for value in values)


def set_rooflines(relative: str, agreeing_only: bool = False) -> tuple[list[Record], list[float]]:
    """The ok trials of one committed set that have a figure against a steady calibration, and those figures in %:
    the roofline (a ratio above 1.0 kept as measured, `ceiling_outrun_fraction`) or, before the stream kernel
    (triad/, roofline-thp/), the ratio it read then over the triad's ceiling (records/upgrade.py, schema 4).
    `agreeing_only`: the trials whose own probe agreed with the calibration."""
    shown = [(r, metrics.record_values(r)["roofline_pct"] if r.device_bandwidth_kernel else
              metrics.triad_roofline_pct(r)) for r in read_records(RESULTS / relative) if r.status == "ok"
             and (not agreeing_only or r.device_bandwidth_probe_disagrees is False)]
    return [r for r, value in shown if value is not None], [value for _, value in shown if value is not None]


def roofline_agreement(relative: str = "roofline.jsonl", agreeing_only: bool = False) -> str:
    """The roofline of one kernel (adamw_fused) over several trials against the calibrated ceiling: its range, how
    far the trials stray from their median, and whether any exceeds 100 % (of `relative` under results/cpu-2core;
    `agreeing_only`: the trials whose own probe agreed with the calibration)."""
    if not (RESULTS / relative).is_file():
        return "not measured yet"
    ok, values = set_rooflines(relative, agreeing_only)
    if not ok:
        return f"no trial in {relative} against a steady calibration"
    stray = stray_from_median(values)
    steps_ms = [1e3 * r.optimizer_step_median_s for r in ok]
    levels = sorted({r.device_bandwidth_working_set_bytes for r in ok if r.device_bandwidth_working_set_bytes})
    kernel = ok[0].device_bandwidth_kernel or "triad"  # records before the field were divided by a triad's
    against = (f" against the {', '.join(f'{level / 2**20:,.0f}' for level in levels)} MiB level's {kernel} "
               f"ceiling of {ok[0].device_bandwidth_calibrated_bytes_per_s / 1e9:.1f} GB/s" if levels else "")
    return (f"the step moves {ok[0].optimizer_step_traffic_bytes / 1e6:,.0f} MB in {min(steps_ms):.1f}–"
            f"{max(steps_ms):.1f} ms{against}: "
            f"{min(values):.1f}–{max(values):.1f} % over {len(values)} trials, each within ±{100 * stray:.1f} % of "
            f"their median ({'within' if stray <= ROOFLINE_AGREEMENT else 'outside'} the ±"
            f"{100 * ROOFLINE_AGREEMENT:.0f} % they must agree to){'; ABOVE 100 %' if max(values) > 100 else ''}")


ROOFLINE_SETS = ("triad/roofline.jsonl", "roofline-thp/off.jsonl", "roofline-thp/on.jsonl", "roofline.jsonl",
                 "roofline-confirm/roofline.jsonl", "roofline-bracketed/roofline.jsonl",
                 "roofline-bracketed-2/roofline.jsonl")
# Every set of five fused-AdamW trials committed under results/cpu-2core, in the order docs/roofline.md tells them
# (the twelve sets, the two-thread control, the thirteenth): what "Does it repeat?" counts.
ROOFLINE_REPEAT_SETS = (*ROOFLINE_SETS, "roofline-steady/roofline.jsonl", "roofline-paired/roofline.jsonl",
                        "roofline-paired-2/roofline.jsonl", "roofline-one-thread/roofline.jsonl",
                        "roofline-one-thread-2/roofline.jsonl", "roofline-two-thread-control/roofline.jsonl",
                        "roofline-one-thread-typed/roofline.jsonl")


def roofline_repeat() -> str:
    """Does a roofline repeat? Per torch thread count, in how many of the committed sets with a steady calibration
    five trials agreed within ±5 % (`roofline_agreement`), and at one thread the range they read."""
    by_threads: dict[int, list[tuple[str, list[float]]]] = {}
    for relative in ROOFLINE_REPEAT_SETS:
        ok, values = set_rooflines(relative)
        threads = {r.env.get("torch_threads") for r in read_records(RESULTS / relative) if r.status == "ok"}
        if len(threads) != 1:
            raise NotMeasured(f"one torch thread count in {relative}")
        if values:  # a set against an unsteady calibration has none
            by_threads.setdefault(int(threads.pop()), []).append((relative, values))
    said = []
    for threads, sets in sorted(by_threads.items(), reverse=True):
        agreed = [values for _, values in sets if stray_from_median(values) <= ROOFLINE_AGREEMENT]
        read = [value for values in agreed for value in values]
        at = (f", at {min(read):.1f}–{max(read):.1f} %{', none above 100 %' if max(read) <= 100 else ''}"
              if read else "")
        said.append(f"at {threads} torch thread(s), five trials of one kernel agreed within "
                    f"±{100 * ROOFLINE_AGREEMENT:.0f} % in {len(agreed)} of the {len(sets)} sets whose calibration "
                    f"was steady{at}")
    return "; ".join(said)


def step_stray(records: list[Record], time_quantile: float) -> float:
    """How far the trials' optimizer-step bandwidth at one quantile of their own step times (0.05: their fastest
    steps) strays from the trials' median, as a fraction (their rooflines' stray: a set divides by one ceiling)."""
    import numpy as np

    return stray_from_median([r.optimizer_step_traffic_bytes / float(np.quantile(r.optimizer_step_samples_s,
                                                                                   time_quantile)) for r in records])


def roofline_fastest_steps() -> str:
    """Whether the rooflines' spread over trials is slow stretches inside each trial (a trial's fastest steps would
    then agree where its median does not) or a speed each process keeps: per committed set, the stray of the
    trials' median step against that of their fastest 5 % of steps."""
    said = []
    for relative in ROOFLINE_SETS:
        ok = [r for r in read_records(RESULTS / relative) if r.status == "ok" and r.optimizer_step_samples_s]
        if not ok:
            raise NotMeasured(f"step samples in {relative}")
        said.append(f"{relative.removesuffix('/roofline.jsonl').removesuffix('.jsonl')} "
                    f"±{100 * step_stray(ok, 0.5):.1f} → ±{100 * step_stray(ok, 0.05):.1f} %")
    return (f"the trials' stray from their median, step median → fastest 5 % of steps: {'; '.join(said)}")


def rooflines_read() -> str:
    """Every committed record read through its schema: how many carry a roofline (the stream kernel's) and the
    largest, how many stored a ratio above 1.0 over a ceiling their step outran (records/upgrade.py, schema 5), and
    how many from before the stream kernel carry a ratio over a triad instead (schema 4)."""
    records = [r for path in RESULTS.rglob("*.jsonl") for r in read_records(path)]
    stream = [pct for r in records if (pct := metrics.record_values(r)["roofline_pct"]) is not None
              and r.roofline_fraction is not None]
    # a share of a ceiling calibrated while the machine changed speed: kept in the record as it read, shown by no
    # table as a roofline (report/metrics.py)
    unsteady = [r for r in records if r.roofline_fraction is not None and
                metrics.record_values(r)["roofline_pct"] is None]
    outran = [r.ceiling_outrun_fraction for r in records if r.ceiling_outrun_fraction is not None]
    triad = [r.triad_roofline_fraction for r in records if r.triad_roofline_fraction is not None]
    if not stream:
        raise NotMeasured("record with a roofline")
    said = (f"{len(stream)} records carry a roofline (against a steady calibration), the largest {max(stream):.1f} %, "
            f"none above 100 % (the schema keeps it so)")
    if unsteady:
        said += (f"; {len(unsteady)} more carry a share of an unsteady calibration's ceiling, which no table shows "
                 f"as a roofline (the largest {100 * max(r.roofline_fraction for r in unsteady):.1f} %)")
    if outran:  # its ceiling did not hold for that trial: the tables show it as a failed calibration
        listed = ", ".join(f"{100 * fraction:.1f}" for fraction in sorted(outran))
        said += (f"; {len(outran)} stored a ratio above 1.0 over a ceiling their step outran ({listed} %), which "
                 "reads back as `ceiling_outrun_fraction`, never as a roofline: a failed measurement, which the tables "
                 "show as `calib. fail` against a steady calibration and leave out of the mean")
    if triad:
        said += (f"; {len(triad)} from before the stream kernel carry a ratio over a triad instead, "
                 f"{sum(t > 1 for t in triad)} of them above 1.0 (the largest {max(triad):.2f})")
    return said


def roofline_confirm(relative: str = "roofline-confirm/roofline.jsonl") -> str:
    """reference-results roofline-confirm: trials until five trials' own probes agreed with the step's calibration
    (ten at most); the agreeing trials' spread, then all of them."""
    path = RESULTS / relative
    if not path.is_file():
        return "not measured yet"
    ok = [r for r in read_records(path) if r.status == "ok"]
    agreeing = sum(r.device_bandwidth_probe_disagrees is False for r in ok)
    said = f"{len(ok)} trials were run and the probes of {agreeing} agreed with the calibration"
    if agreeing == len(ok):
        return f"{said}: {roofline_agreement(relative)}"
    return (f"{said}. Those {agreeing}: {roofline_agreement(relative, agreeing_only=True)}. All {len(ok)}: "
            f"{roofline_agreement(relative)}")


def roofline_bracketed(folder: str = "roofline-bracketed") -> str:
    """reference-results roofline-bracketed: five trials between two calibrations; their spread, and whether the
    machine held its speed over the set (the second calibration's ceiling at the trials' level within the first's
    5-95 % range). A second calibration that was itself unsteady says so: kept as a file (--keep-unsteady), or, where
    calibrate-bandwidth refused to write it, as what it printed (after-unsteady.txt)."""
    from optbench.probes import bandwidth

    before, after = RESULTS / folder / "before.json", RESULTS / folder / "after.json"
    printed = RESULTS / folder / "after-unsteady.txt"
    records = RESULTS / folder / "roofline.jsonl"
    if not (before.is_file() and (after.is_file() or printed.is_file()) and records.is_file()):
        return "not measured yet"
    working_sets = {r.device_bandwidth_working_set_bytes for r in read_records(records) if r.status == "ok"}
    working_set = min((w for w in working_sets if w), default=None)
    first = bandwidth.read(before).level_for(working_set)
    if after.is_file():
        level = bandwidth.read(after).level_for(working_set)
        ceiling, slowest = level.ceiling_bytes_per_s, level.quantiles_bytes_per_s["0.05"] / level.ceiling_bytes_per_s
        unsteady = "" if level.steady else f"; that calibration was itself unsteady (its slowest passes ran at " \
                                           f"{100 * slowest:.0f} % of its fastest)"
    else:
        _, ceiling, slowest_pct = _printed_level(printed, round((working_set or first.working_set_bytes) / 2**20))
        unsteady = (f"; that calibration was itself unsteady (its slowest passes ran at {slowest_pct} % of its "
                    "fastest) and calibrate-bandwidth refused to write it: after-unsteady.txt is what it printed")
    held = not first.disagrees(ceiling)
    q = first.quantiles_bytes_per_s
    return (f"{roofline_agreement(f'{folder}/roofline.jsonl')}. The calibration after them read that level's "
            f"ceiling at {ceiling / 1e9:.1f} GB/s, against {first.ceiling_bytes_per_s / 1e9:.1f} "
            f"before (5–95 % {q['0.05'] / 1e9:.1f}–{q['0.95'] / 1e9:.1f}): the machine "
            f"{'held' if held else 'did not hold'} its speed over the set by that rule{unsteady}")


def steadiness_check(path: Path) -> str:
    """One scripts/steadiness_probe.py check: the processes' medians, their stray and the verdict."""
    data = json.loads(path.read_text())
    gbs = [m / 1e9 for m in data["median_bytes_per_s"]]
    return (f"{data['processes']} processes read {min(gbs):.1f}–{max(gbs):.1f} GB/s, within "
            f"±{100 * data['stray']:.1f} % of their median: {'steady' if data['steady'] else 'not steady'} by the "
            f"±{100 * data['tolerance']:.1f} % rule")


def roofline_steady() -> str:
    """reference-results roofline-steady: every steadiness check before the set (refused ones kept) and the host
    they ran on, then the bracketed set's outcome and the check after it, or that the set has not run."""
    folder = RESULTS / "roofline-steady"
    paths = sorted(folder.glob("pre-check-*.json"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    if not paths:
        return "not measured yet"
    checks = [json.loads(p.read_text()) for p in paths]
    refused = [c for c in checks if not c["steady"]]
    said = f"the check ran {len(checks)} time(s) on an {_host(checks[0]['env'])} host"
    if refused:
        gbs = [m / 1e9 for c in refused for m in c["median_bytes_per_s"]]
        strays = ", ".join(f"±{100 * c['stray']:.1f}" for c in refused)
        said += (f"; {len(refused)} found it not steady, their processes straying {strays} % from their median "
                 f"({min(gbs):.1f}–{max(gbs):.1f} GB/s in all) against the ±{100 * refused[0]['tolerance']:.1f} % "
                 "rule")
    if not (folder / "before.json").is_file():
        return f"{said}; so the set has not run"
    after = folder / "post-check.json"
    post = f"; after the set {steadiness_check(after)}" if after.is_file() else "; the check after the set did not run"
    return (f"{said}; the last: {steadiness_check(paths[-1])}, and the set ran: "
            f"{roofline_bracketed('roofline-steady')}{post}")


def roofline_paired(name: str = "roofline-paired") -> str:
    """reference-results roofline-paired (and its replication, roofline-paired-2): five fused-AdamW trials with
    --paired-probe, each step against the stream kernel's pass right after it (the trial's median share), and the same
    trials against the calibrated ceiling."""
    folder = RESULTS / name
    records = folder / "roofline.jsonl"
    if not records.is_file():
        return "not measured yet"
    ok = [r for r in read_records(records) if r.status == "ok" and r.paired_roofline_fraction is not None]
    if not ok:
        raise NotMeasured(f"a trial with a paired share in {name}/roofline.jsonl")
    shares = [100 * r.paired_roofline_fraction for r in ok]
    stray = stray_from_median(shares)
    passes = [b / 1e9 for r in ok for b in r.paired_probe_bytes_per_s]
    achieved = [r.optimizer_step_traffic_bytes / r.optimizer_step_median_s / 1e9 for r in ok]
    from optbench.probes import bandwidth

    steady_before = (folder / "before.json").is_file() and bandwidth.read(folder / "before.json").steady
    unsteady = "" if steady_before else " (itself unsteady: kept with --keep-unsteady)"
    return (f"each step against the pass after it: {min(shares):.1f}–{max(shares):.1f} % over {len(ok)} trials, each "
            f"within ±{100 * stray:.1f} % of their median "
            f"({'within' if stray <= ROOFLINE_AGREEMENT else 'outside'} the ±{100 * ROOFLINE_AGREEMENT:.0f} % they "
            f"must agree to){'; ABOVE 100 %' if max(shares) > 100 else ''}, while the passes themselves read "
            f"{min(passes):.1f}–{max(passes):.1f} GB/s. Against any one ceiling the same trials stray as their "
            f"steps' own bandwidth does, {min(achieved):.1f}–{max(achieved):.1f} GB/s, ±"
            f"{100 * stray_from_median(achieved):.1f} %. Against the calibration{unsteady}: "
            f"{roofline_bracketed(name)}")


def roofline_threads(name: str = "roofline-one-thread") -> str:
    """reference-results roofline-one-thread (its replication, and the two-thread control): the paired set
    (roofline_paired) with every process at one thread count, between two steadiness checks at that count that gate
    nothing; the thread count is the records' own."""
    folder = RESULTS / name
    if not (folder / "roofline.jsonl").is_file():
        refused = refused_attempts(folder)
        return f"not run: {'; '.join(refused)}" if refused else "not measured yet"
    threads = sorted({r.env.get("torch_threads") for r in read_records(folder / "roofline.jsonl")}, key=str)
    pre, post = folder / "pre-check.json", folder / "post-check.json"
    before = f"before the set {steadiness_check(pre)}; " if pre.is_file() else ""
    after = f"; after the set {steadiness_check(post)}" if post.is_file() else "; the check after the set did not run"
    return (f"trials at {', '.join(map(str, threads))} torch thread(s): {before}"
            f"{roofline_paired(name)}{after}")


def refused_attempts(folder: Path) -> list[str]:
    """A set's attempts that stopped at their first calibration, which refused to write (the host changed speed
    while it was measured): each one's steadiness check and its largest level, from refused-N-pre-check.json and
    refused-N-before.txt (what calibrate-bandwidth printed); the level the step's 364 MB divides by here."""
    said = []
    for printed in sorted(folder.glob("refused-*-before.txt"), key=lambda p: int(p.name.split("-")[1])):
        number = printed.name.split("-")[1]
        mib, ceiling, slowest_pct = _printed_level(printed)
        check = folder / f"refused-{number}-pre-check.json"
        threads = json.loads(check.read_text())["env"].get("torch_threads") if check.is_file() else None
        before = f"before it, at {threads} torch thread(s), {steadiness_check(check)}; " if check.is_file() else ""
        said.append(f"attempt {number}: {before}the calibration refused to write, its {mib} MiB level's slowest "
                    f"passes at {slowest_pct} % of its fastest (ceiling {ceiling / 1e9:.1f} GB/s; {printed.name} is "
                    "what it printed)")
    return said


def _printed_levels(path: Path) -> dict[int, tuple[float, str | None]]:
    """Every level in what calibrate-bandwidth printed, read once: {MiB: (ceiling in bytes/s, the slowest passes'
    share of the fastest in % where it called the level unsteady, else None)}, from lines such as
    `       128 MiB: ceiling 35.0 GB/s (200 passes; ...); unsteady: its slowest passes ran at 65% of its fastest`."""
    levels = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        found = re.match(r"\s*([\d,]+) MiB: ceiling ([\d.]+) GB/s(?:.*ran at (\d+)% of its fastest)?", line)
        if found:
            levels[int(found.group(1).replace(",", ""))] = (float(found.group(2)) * 1e9, found.group(3))
    return levels


def _printed_level(path: Path, mib: int | None = None) -> tuple[int, float, str]:
    """(MiB, ceiling in bytes/s, slowest passes' share of the fastest in %) of one unsteady level of what
    calibrate-bandwidth printed (`_printed_levels`): the level of `mib`, or the largest one."""
    levels = _printed_levels(path)
    mib = max(levels, default=0) if mib is None else mib
    ceiling, slowest_pct = levels.get(mib, (None, None))
    if ceiling is None or slowest_pct is None:
        raise NotMeasured(f"the unsteady {mib:,} MiB level in {path.name}")
    return mib, ceiling, slowest_pct


def step_drift() -> str:
    """scripts/step_drift_probe.py: one process's fused AdamW step in blocks over minutes, and whether it moved with
    the forward/backward."""
    path = RESULTS / "step-drift-probe.json"
    if not path.is_file():
        return "not measured yet"
    data = json.loads(path.read_text())
    steps_ms = [1e3 * block["step_s"] for block in data["blocks"]]
    return (f"{len(steps_ms)} blocks of {data['block_steps']} steps over {data['blocks'][-1]['at_s']:.0f} s: the "
            f"step's block medians ran {min(steps_ms):.1f}–{max(steps_ms):.1f} ms, each within "
            f"±{100 * data['step_stray']:.1f} % of their median, with a Spearman ρ of "
            f"{data['step_vs_forward_backward_spearman']:.2f} (p = {data['step_vs_forward_backward_p']:.2g}) against "
            "the forward/backward's")


def kernel_width() -> str:
    """scripts/kernel_width_probe.py: what kernels of two, three and four operands stream over the same working
    sets (medians of their passes), and MiniLM's fused AdamW step alone against the calibrated ceilings of its
    level, the stream kernel's now and the triad's before."""
    path = RESULTS / "kernel-width-probe.json"
    if not path.is_file():
        return "not measured yet"
    data = json.loads(path.read_text())
    sizes = list(data["kernels"])
    rates = {name: "/".join(f"{data['kernels'][size][name]['median_bytes_per_s'] / 1e9:.1f}" for size in sizes)
             for name in data["kernels"][sizes[0]]}
    step = data["minilm_fused_adamw_step"]
    said = (f"over {'/'.join(sizes)} MiB working sets the triad streamed {rates['triad']} GB/s (medians of "
            f"{data['rounds'] * data['passes']} passes each), `addcmul_` {rates['addcmul']}, the fused AdamW update "
            f"{rates['fused-adamw']}; MiniLM's fused AdamW step alone in the process moved its "
            f"{step['traffic_bytes'] / 1e6:,.0f} MB in {1e3 * step['median_s']:.2f} ms, "
            f"{step['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s")
    ceilings = []
    for name, relative in (("the stream kernel's", "roofline.jsonl"), ("the triad's", "triad/roofline.jsonl")):
        found = [r for r in read_records(RESULTS / relative) if r.device_bandwidth_calibrated_bytes_per_s] \
            if (RESULTS / relative).is_file() else []
        if found:
            ceiling = found[0].device_bandwidth_calibrated_bytes_per_s
            ceilings.append(f"{100 * step['bandwidth_bytes_per_s'] / ceiling:.0f} % of {name} ceiling "
                            f"({ceiling / 1e9:.1f} GB/s)")
    return said + (": " + ", ".join(ceilings) if ceilings else "")


def probe(kind: str) -> str:
    """A figure of scripts/bare_loop_probe.py: a bare loop on other batches against one on the workload's."""
    data = json.loads((RESULTS / "bare-loop-probe.json").read_text())
    if kind == "padding":
        return f"{100 * (1 - data['non_padding_token_share']):.0f} %"
    return f"{100 * (data['ratio_to_workload'][kind] - 1):+.1f} %"


def fidelity_table() -> str:
    frame = trials_frame(_records(("fidelity.jsonl",)))
    ok = frame[frame["status"] == "ok"]
    table = pd.DataFrame({"optimizer": ok["optimizer"],
                          "update cosine (median over steps)": ok["update_cosine_median"].map("{:.4f}".format),
                          "update rel. error (median)": ok["update_rel_error_median"].map("{:.3f}".format),
                          "train mem MiB (with the shadow AdamW)": ok["train_mem_mib"].map("{:,.0f}".format)})
    return table.to_markdown(index=False)


def memory_split() -> str:
    """The peak split of the default job: peak = weights + grads + state + the rest."""
    frame = trials_frame(_records(("default.jsonl",)))
    ok = frame[frame["status"] == "ok"]
    columns = {"peak MiB": "peak_memory_mib", "weights MiB": "weights_mib", "grads MiB": "grads_mib",
               "state MiB": "state_mib", "other MiB": "other_peak_mib"}
    table = pd.DataFrame({"optimizer": ok["optimizer"],
                          **{title: ok[column].map("{:,.1f}".format) for title, column in columns.items()}})
    return table.to_markdown(index=False)


def scaling_tables() -> str:
    from optbench.report.scaling import render_scaling_markdown

    text = render_scaling_markdown(_records(("scaling.jsonl",)))
    return "\n".join(line for line in text.splitlines() if not line.startswith("###")).strip()


GATE_RUNS = (("rerun", 0.0, "same-commit rerun"), ("slow-0.15", 0.15, "+15 % injected"),
             ("slow-0.2", 0.2, "+20 % injected"), ("slow-0.3", 0.3, "+30 % injected"))


def gate_sleep_table() -> str:
    """The old gate's runs (one process per optimizer, the knob sleeping): against the base run, the optimizer
    step as measured, the step itself (measured / (1 + injected): what the sleep left of it) and the rest of the
    train step (forward, backward, zero_grad)."""
    base = {r.optimizer: r for r in read_records(RESULTS / "gate" / "base.jsonl")}
    rows = []
    for name, fraction, title in GATE_RUNS:
        for record in read_records(RESULTS / "gate" / f"{name}.jsonl"):
            before = base[record.optimizer]
            step, rest = (record.optimizer_step_median_s, before.optimizer_step_median_s), (
                record.step_time_median_s - record.optimizer_step_median_s,
                before.step_time_median_s - before.optimizer_step_median_s)
            rows.append({"run": title, "optimizer": record.optimizer,
                         "optimizer step": f"{100 * (step[0] / step[1] - 1):+.1f} %",
                         "the step itself": f"{100 * (step[0] / (1 + fraction) / step[1] - 1):+.1f} %",
                         "rest of the train step": f"{100 * (rest[0] / rest[1] - 1):+.1f} %"})
    return pd.DataFrame(rows).to_markdown(index=False)


def gate_campaign_table(relative: str = "gate-campaign") -> str:
    """A gate campaign's rates (scripts/gate-campaign): `gate-campaign` took turns by sweep, `gate-campaign-trials`
    (reference-results gate-trials) trial by trial."""
    from optbench.report import campaign

    return campaign.summary_markdown(RESULTS / relative)


def gate_campaign_said(relative: str, optimizer: str = "adamw") -> str:
    """A gate campaign's outcome for one optimizer in words: per comparison, how many tries measured within the
    tolerance of the injected change, the median, and how many were flagged: first as the gate read them when the
    campaign ran (unadjusted), then adjusted for each process's speed (report/noise.py)."""
    from optbench.report import campaign

    found = campaign.outcomes(RESULTS / relative)
    said = [f"{kind}: {o.within_tolerance(unadjusted=True)} of {o.compared} within ±{campaign.TOLERANCE_PTS:g} "
            f"points of {o.injected_pct:+g} % (median {statistics.median(o.unadjusted_changes):+.1f} %), "
            f"{o.unadjusted_flagged} flagged; adjusted for each process's speed (applied in {o.adjusted} of "
            f"{o.compared}), {o.within_tolerance()} of "
            f"{o.compared} (median {statistics.median(o.changes):+.1f} %), {o.flagged} flagged"
            for kind, per in found.items() if (o := per.get(optimizer))]
    if not said:
        raise NotMeasured(f"{optimizer} comparisons in {relative}")
    return "; ".join(said)


def campaign_process_spread(relative: str) -> str:
    """How far one run's processes (seeds) of a gate campaign spread: the log SD of their optimizer-step medians,
    the median over the campaign's same-commit runs (the slowed ones add the knob's own spread); the torch threads
    and the 1-minute load their trials started under."""
    import math

    runs = [[r for r in read_records(path) if r.status == "ok"] for path in sorted((RESULTS / relative / "same").glob(
        "run-*.jsonl"))]
    spreads = [statistics.stdev(math.log(r.optimizer_step_median_s) for r in run) for run in runs if len(run) > 1]
    loads = [r.env["load_avg_1m"] for run in runs for r in run if r.env.get("load_avg_1m") is not None]
    threads = sorted({str(r.env["torch_threads"]) for run in runs for r in run if r.env.get("torch_threads")})
    if not spreads:
        raise NotMeasured(f"runs in {relative}")
    return (f"a run's step medians had a log SD of {100 * statistics.median(spreads):.1f} % (the median over its "
            f"{len(spreads)} same-commit runs, at {' or '.join(threads) or 'unstamped'} torch thread(s); their trials "
            f"started at a 1-minute load of {min(loads):.1f}–{max(loads):.1f})")


PROCESS_SPEED_CAMPAIGNS = (("gate-campaign-trials-6-adafactor", "Adafactor, +30 %"),
                           ("gate-campaign-trials-6-adafactor-20", "Adafactor, +20 %"),
                           ("gate-campaign-trials-6-adafactor-one-thread", "Adafactor, one thread"),
                           ("gate-campaign-trials-6", "AdamW, +30 %"), ("gate-campaign-trials-6-20", "AdamW, +20 %"))


def process_speed() -> str:
    """Whether a process's optimizer step moves with the rest of its step: per trial-by-trial campaign, Pearson's r
    between the log optimizer-step and log rest-of-step medians over its same-commit processes, and the slope of
    the first on the second (what report/noise.py's adjustment regresses out)."""
    import math

    from scipy import stats

    from optbench.report import metrics

    said = []
    for relative, name in PROCESS_SPEED_CAMPAIGNS:
        pairs = [(math.log(r.optimizer_step_median_s), math.log(rest))
                 for path in sorted((RESULTS / relative / "same").glob("run-*.jsonl")) for r in read_records(path)
                 if r.status == "ok" and (rest := metrics.BY_COLUMN["rest_of_step_ms"].value(r))]
        if len(pairs) < 3:
            raise NotMeasured(f"same-commit processes in {relative}")
        fit = stats.linregress([x for _, x in pairs], [y for y, _ in pairs])
        said.append(f"{name} r = {fit.rvalue:.2f} (slope {fit.slope:.2f}, {len(pairs)} processes)")
    return "; ".join(said)


def slowdown_probe(mode: str) -> str:
    """scripts/slowdown_probe.py: in one process, what a sleeping and a spinning knob do to the steps around them."""
    path = RESULTS / "slowdown-probe.json"
    if not path.is_file():
        return "not measured yet"
    data = json.loads(path.read_text())
    change, late = data["vs_off"][mode], data["medians"][mode].get("late", 0.0)
    return (f"the step itself {100 * change['step_s']:+.1f} %, the next forward/backward "
            f"{100 * change['forward_backward_s']:+.1f} %, the wait {100 * late:+.1f} % longer than asked")


DELTA = "accuracy Δ vs adamw (95% CI)"
ROOFLINE = ("roofline %", "bandwidth GB/s")  # empty until the records carry a bandwidth calibration
DETECTABLE = report.DETECTABLE
RESUME_COLUMNS = ("optimizer", "status", "state MiB", "ckpt MiB", "ckpt save s", "ckpt load s", "resume",
                  "resume max Δparam")
STUDY_COLUMNS = ("optimizer", "tuned lr", "near-tie band", "eval accuracy", "ceiling", DELTA, DETECTABLE,
                 "time to target s", "state MiB", "train mem MiB", "step ms")
TABLES: dict[str, Callable[[], str]] = {
    "study": lambda: render_table(Table(("study.jsonl",), STUDY_COLUMNS)),
    # quality only: the control is about power, and its times are not a reference (its load is in the provenance)
    # (no MDD column where the control did not train: no figure, so no spread of differences to read it from)
    "study-control": lambda: render_table(Table(("study-control.jsonl",), (
        "optimizer", "tuned lr", "eval accuracy", "ceiling", DELTA, DETECTABLE), optional=(DETECTABLE,))),
    # the batch-16 design on the task with headroom (docs/study.md's history), as the README showed it
    "design": design_table,
    "batch16-study": lambda: render_table(Table(("batch16/study.jsonl",), STUDY_COLUMNS)),
    "batch16-control": lambda: render_table(Table(("batch16/study-control.jsonl",), (
        "optimizer", "tuned lr", "eval accuracy", "ceiling", DELTA, DETECTABLE))),
    # the designs before the task had headroom (docs/study.md's history): their records, rendered as they are
    "saturated-study": lambda: render_table(Table(("saturated/study.jsonl",), (
        "optimizer", "tuned lr", "near-tie band", "eval accuracy", DELTA, "time to target s", "state MiB",
        "train mem MiB", "step ms"))),
    "study-100steps": lambda: render_table(Table(("saturated/study-100steps.jsonl",), (
        "optimizer", "tuned lr", "eval accuracy", DELTA, "state MiB"))),
    "study-smoke": lambda: render_table(Table(("study-smoke.jsonl",), (
        "optimizer", "tuned lr", "eval accuracy", DELTA, "state MiB"))),
    "default": lambda: render_table(Table(("default.jsonl",), (
        "optimizer", "state MiB", "state B/param", "train mem MiB", "held MiB", "held other MiB", "step ms",
        "opt step ms", "eval accuracy", DELTA, "mem saved % vs adamw", "speed x vs adamw"))),
    "registry": lambda: render_table(Table(("registry.jsonl",), (
        "optimizer", "state precision", "state MiB", "state B/param", "fp32 state %", "train mem MiB", "step ms",
        "opt step ms", "impl", "roofline %", "bandwidth GB/s", "bw working set MiB", "bw ceiling", "probe GB/s",
        "first step s"), optional=(*ROOFLINE, "bw working set MiB"))),
    "smoke-all": lambda: render_table(Table(("smoke-all.jsonl",), (
        "optimizer", "state precision", "status", "state MiB", "state B/param", "= analytic", "fp32 state %",
        "first step s", "opt step ms", "ckpt MiB", "ckpt save s", "ckpt load s", "resume", "resume max Δparam"))),
    "resume-fsdp2": lambda: render_table(Table(("resume-fsdp2.jsonl",), RESUME_COLUMNS)),
    "resume-trainer": lambda: render_table(Table(("resume-trainer.jsonl",), RESUME_COLUMNS)),
    "lm": lambda: render_table(Table(("lm.jsonl",), (
        "optimizer", "state MiB", "state B/param", "fp32 state %", "eval perplexity", "floor",
        "perplexity Δ vs adamw (95% CI)", "step ms", "opt step ms", "roofline %", "bw working set MiB", "bw ceiling"),
        optional=(*ROOFLINE, "bw working set MiB"))),
    "precision": lambda: side_by_side("precision.jsonl"),
    "engines": lambda: side_by_side("engines/native.jsonl", "engines/trainer.jsonl", "engines/accelerate.jsonl"),
    "parallel": lambda: per_rank("parallel/ddp.jsonl", "parallel/zero1.jsonl", "parallel/fsdp2.jsonl"),
    "sharding": lambda: sharding_table("sharding/zero1.jsonl", "sharding/fsdp2.jsonl"),
    "fit": fit_table,
    "predictor-fresh": lambda: predictor_coverage("table"),
    "provenance": provenance_table,
    "fidelity": fidelity_table,
    "memory-split": memory_split,
    "scaling": scaling_tables,
    "gpu": lambda: gpu_section(ROOT / "results"),
    "gate-campaign": gate_campaign_table,
    "gate-campaign-trials": lambda: gate_campaign_table("gate-campaign-trials"),
    "gate-campaign-trials-6": lambda: gate_campaign_table("gate-campaign-trials-6"),
    "gate-campaign-trials-6-20": lambda: gate_campaign_table("gate-campaign-trials-6-20"),
    "gate-campaign-trials-6-adafactor": lambda: gate_campaign_table("gate-campaign-trials-6-adafactor"),
    "gate-campaign-trials-6-adafactor-20": lambda: gate_campaign_table("gate-campaign-trials-6-adafactor-20"),
    "gate-campaign-trials-6-adafactor-one-thread": lambda: gate_campaign_table(
        "gate-campaign-trials-6-adafactor-one-thread"),
    "gate-campaign-trials-6-adafactor-adjusted": lambda: gate_campaign_table(
        "gate-campaign-trials-6-adafactor-adjusted"),
    "gate-sleep": gate_sleep_table,
    "harness-factors": harness_factors_table,
    "recommend-study": lambda: command_output("recommend", "--params", "22714371", "--gpu-memory", "1.1GiB",
                                              "--results", "results/cpu-2core/study.jsonl",
                                              "--optimizers", "adamw,adafactor,adamw8bit"),
    "estimate-66m": lambda: command_output("estimate", "--params", "65783042", "--optimizers", ESTIMATE_SHOWN),
    "estimate-7b": lambda: command_output("estimate", "--params", "7B", "--gpus", "8", "--gpu-memory", "80GiB",
                                          "--optimizers", ESTIMATE_SHOWN),
}


def exit_codes() -> str:
    """The exit codes and what each means, from the one table the commands return them by."""
    from optbench.records import exits

    return "; ".join(f"{code} {meaning}" for code, meaning in sorted(exits.TABLE.items()))


VALUES: dict[str, Callable[[], str]] = {
    "exits": exit_codes,
    "registry.entries": registry_entries,
    "provenance.hosts": hosts,
    "record.schema": lambda: str(SCHEMA_VERSION),
    "study.minutes": lambda: sweep_minutes("study.jsonl"),
    "study-control.minutes": lambda: sweep_minutes("study-control.jsonl"),
    "saturated-study.minutes": lambda: sweep_minutes("saturated/study.jsonl"),
    "batch16-study.minutes": lambda: sweep_minutes("batch16/study.jsonl"),
    "batch16-study.adamw.spread": lambda: spread_pts("batch16/study.jsonl", "adamw"),
    "batch16-study.adamw8bit.power": lambda: power_cost("adamw8bit", study_file="batch16/study.jsonl"),
    "study.ceiling": lambda: bound("study.jsonl", "metric_ceiling"),
    "default.vs-study": run_vs_study,
    "study.adamw8bit.power": lambda: power_cost("adamw8bit"),
    "study.chance": lambda: bound("study.jsonl", "metric_chance"),
    "lm.floor": lambda: bound("lm.jsonl", "metric_ceiling", 2),
    "lm.unigram": lambda: bound("lm.jsonl", "metric_chance", 1),
    "schedule.constant.spread": lambda: spread_pts("schedule/constant.jsonl"),
    "schedule.linear.spread": lambda: spread_pts("schedule/linear.jsonl"),
    "study.adamw.spread": lambda: spread_pts("study.jsonl", "adamw"),
    "saturated-study.adamw.spread": lambda: spread_pts("saturated/study.jsonl", "adamw"),
    "study-100steps.adamw.spread": lambda: spread_pts("saturated/study-100steps.jsonl", "adamw"),
    "resume-fsdp2.errors": lambda: errors("resume-fsdp2.jsonl"),
    "resume-trainer.errors": lambda: resume_errors("resume-trainer.jsonl"),
    "explain.adamw8bit_hf": lambda: explain("adamw8bit_hf"),
    "predictor.band": predictor_band,
    "predictor.coverage": lambda: predictor_coverage("summary"),
    "predictor.coverage-first": first_fresh_coverage,
    "roofline.agreement": roofline_agreement,
    "roofline.repeat": roofline_repeat,
    "roofline.agreement-triad": lambda: roofline_agreement("triad/roofline.jsonl"),
    "roofline.confirm": roofline_confirm,
    "roofline.read": rooflines_read,
    "roofline.bracketed": roofline_bracketed,
    "roofline.bracketed-2": lambda: roofline_bracketed("roofline-bracketed-2"),
    "roofline.steady": roofline_steady,
    "roofline.paired": roofline_paired,
    "roofline.paired-2": lambda: roofline_paired("roofline-paired-2"),
    "roofline.one-thread": roofline_threads,
    "roofline.one-thread-2": lambda: roofline_threads("roofline-one-thread-2"),
    "roofline.two-thread-control": lambda: roofline_threads("roofline-two-thread-control"),
    "roofline.one-thread-typed": lambda: roofline_threads("roofline-one-thread-typed"),
    "roofline.kernel-width": kernel_width,
    "roofline.step-drift": step_drift,
    "roofline.fastest-steps": roofline_fastest_steps,
    "roofline.thp-off": lambda: roofline_agreement("roofline-thp/off.jsonl"),
    "roofline.thp-on": lambda: roofline_agreement("roofline-thp/on.jsonl"),
    "new-entries.summary": new_entries,
    "harness.summary": harness_summary,
    "harness.repeat": lambda: f"{harness_where(HARNESS_REPEAT)}: {harness_summary(HARNESS_REPEAT)}",
    "fit.repeat": fit_repeat,
    "gate.process-speed": process_speed,
    "gate.trials": lambda: gate_campaign_said("gate-campaign-trials"),
    "gate.trials-6": lambda: gate_campaign_said("gate-campaign-trials-6"),
    "gate.trials-spread": lambda: campaign_process_spread("gate-campaign-trials"),
    "gate.trials-6-spread": lambda: campaign_process_spread("gate-campaign-trials-6"),
    "gate.trials-6-20": lambda: gate_campaign_said("gate-campaign-trials-6-20"),
    "gate.trials-6-20-spread": lambda: campaign_process_spread("gate-campaign-trials-6-20"),
    "gate.trials-6-adafactor": lambda: gate_campaign_said("gate-campaign-trials-6-adafactor", "adafactor"),
    "gate.trials-6-adafactor-spread": lambda: campaign_process_spread("gate-campaign-trials-6-adafactor"),
    "gate.trials-6-adafactor-20": lambda: gate_campaign_said("gate-campaign-trials-6-adafactor-20", "adafactor"),
    "gate.trials-6-adafactor-20-spread": lambda: campaign_process_spread("gate-campaign-trials-6-adafactor-20"),
    "gate.trials-6-adafactor-one-thread": lambda: gate_campaign_said("gate-campaign-trials-6-adafactor-one-thread",
                                                                     "adafactor"),
    "gate.trials-6-adafactor-one-thread-spread": lambda: campaign_process_spread(
        "gate-campaign-trials-6-adafactor-one-thread"),
    "gate.trials-6-adafactor-adjusted": lambda: gate_campaign_said("gate-campaign-trials-6-adafactor-adjusted",
                                                                   "adafactor"),
    "gate.trials-6-adafactor-adjusted-spread": lambda: campaign_process_spread(
        "gate-campaign-trials-6-adafactor-adjusted"),
    "probe.sleep": lambda: slowdown_probe("sleep"),
    "probe.spin": lambda: slowdown_probe("spin"),
    "probe.padding": lambda: probe("padding"),
    "probe.random": lambda: probe("random-ids-full-mask"),
    "probe.unmasked": lambda: probe("workload-ids-full-mask"),
}


def render(kind: str, name: str) -> str:
    """The block's text; a block whose records are not there yet says so, and which step makes them."""
    try:
        if kind == "table":
            return "\n" + TABLES[name]().strip() + "\n"
        return VALUES[name]()
    except NotMeasured as missing:
        text = f"not measured yet: no {missing} under results/cpu-2core/ (run scripts/reference-results)"
        return f"\n*{text}*\n" if kind == "table" else text


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


def unrendered_tables(text: str) -> list[int]:
    """Line numbers of markdown table rows outside every rendered block (and outside code fences): a table typed
    or pasted by hand, which no check would see drift from its records."""
    inside = [(m.start(), m.end()) for m in BLOCK.finditer(text)]
    found, fence, offset = [], False, 0
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        fence = fence != line.startswith("```")
        if line.startswith("|") and not fence and not any(start <= offset < end for start, end in inside):
            found.append(number)
        offset += len(line)
    return found


def main(argv: list[str]) -> int:
    filter_known_noise()
    check = "--check" in argv
    stale = [f"README.md:{n}: a table row not rendered from records" for n in unrendered_tables(README.read_text())]
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
