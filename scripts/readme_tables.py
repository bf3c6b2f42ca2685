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
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optbench.records.record import Record, read_records  # noqa: E402
from optbench.report import render as report  # noqa: E402
from optbench.report.frame import summarize, trials_frame  # noqa: E402

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
    """Which commit each results file was measured at: `abc1234` (default, registry), `def5678` (lm, ...)."""
    stems: dict[str, list[str]] = {}
    for name in files:
        shas = (str(r.env["git_commit"])[:7] for r in _records((name,)) if r.env.get("git_commit"))
        for sha in dict.fromkeys(shas):
            stems.setdefault(sha, []).append(name.removesuffix(".jsonl"))
    return "; ".join(f"`{sha}` ({', '.join(names)})" for sha, names in stems.items())


def harness(key: str) -> str:
    """A figure of the harness-vs-bare check (`pytest benchmarks -k harness --benchmark-json`)."""
    data = json.loads((RESULTS / "harness.json").read_text())
    info = next(b["extra_info"] for b in data["benchmarks"] if b["extra_info"].get("kind") == "harness_overhead")
    within = abs(info["harness_to_bare_ratio"] - 1) <= info["tolerance"]
    if key == "summary":  # the README: the figure only where the check could tell
        if not info["conclusive"]:
            return (f"unmeasured — the bare loop's own runs spread {info['bare_run_spread']:.1%} (inter-quartile "
                    f"range over median), more than the {info['tolerance']:.0%} the check must resolve")
        return (f"median pair ratio {info['harness_to_bare_ratio']:.3f}, {'within' if within else 'outside'} the "
                f"{info['tolerance']:.0%} tolerance (bare runs' spread {info['bare_run_spread']:.1%})")
    if key == "verdict":
        return (f"within the {info['tolerance']:.0%} tolerance" if info["conclusive"] and within else
                "not published: the check failed or was too noisy to tell")
    return {"ratio": f"{info['harness_to_bare_ratio']:.3f}", "spread": f"{100 * info['bare_run_spread']:.1f} %",
            "pairs": "–".join(f"{r:.3f}" for r in (min(info["pair_ratios"]), max(info["pair_ratios"])))}[key]


def side_by_side(*files: str) -> str:
    """The report's side-by-side table (jobs differing only in precision or engine), without its heading."""
    text = report.render_side_by_side_markdown(summarize(trials_frame(current_lm(_records(files), ", ".join(files)))))
    return "\n".join(line for line in text.strip().splitlines() if not line.startswith("###")).strip()


def per_rank(*files: str) -> str:
    from optbench.trial.engines.parallel import per_rank_markdown

    return per_rank_markdown(_records(files)).strip()


def errors(*files: str) -> str:
    """The failed rows' messages, one bullet each (what the library said)."""
    lines = [_failed(r) for r in _records(files) if r.status != "ok"]
    return "\n".join(lines) or "(every trial ran)"


def _failed(record: Record) -> str:
    return f"- {record.optimizer} ({record.status}): {record.error}"


def resume_errors(*files: str) -> str:
    """Every row that did not resume exactly, with the reason: a failed trial's message or the resume status."""
    lines = [_failed(r) if r.status != "ok" else f"- {r.optimizer}: {r.resume_status}"
             for r in _records(files) if r.status != "ok" or r.resume_status != "exact"]
    return "\n".join(lines) or "(every entry resumed exactly)"


def spread_pts(file: str, optimizer: str | None = None) -> str:
    """Max minus min of the target metric over the seeds, in points; in a study, `optimizer`'s seeds at the lr its
    finals ran at (the tune trial at that lr is seed 0's final)."""
    records = [r for r in _records((file,)) if r.status == "ok" and optimizer in (None, r.optimizer)]
    final_lrs = {r.lr for r in records if r.stage == "final"}
    values = [r.eval_metrics[r.target_metric] for r in records if not final_lrs or r.lr in final_lrs]
    return f"{100 * (max(values) - min(values)):.1f}"


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


def explain(optimizer: str) -> str:
    from optbench.memory import statemap

    return "\n" + statemap.explain(optimizer).strip() + "\n"


def predictor_band() -> str:
    from optbench.memory import calibrate
    from optbench.memory.calibration import load_calibrations

    held = read_records(RESULTS / "predictor" / "held-out.jsonl")
    current_lm(held, "predictor/held-out.jsonl")
    table = calibrate.validation_table(held, load_calibrations("cpu"))
    return calibrate.error_band(table, "cpu").describe()


def fit_table() -> str:
    """The table `optbench fit` wrote beside its records (the growth it shows is not a record field)."""
    text = (RESULTS / "fit.md").read_text(encoding="utf-8")
    return "\n".join(line for line in text.splitlines() if line.startswith("|"))


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


GATE_RUNS = (("rerun", "same-commit rerun"), ("slow-0.15", "+15 % injected"), ("slow-0.2", "+20 % injected"),
             ("slow-0.3", "+30 % injected"))


def _gate(name: str):
    from optbench.report import compare

    base = read_records(RESULTS / "gate" / "base.jsonl")
    new = read_records(RESULTS / "gate" / f"{name}.jsonl")
    return compare.compare(base, new, compare.calibrated_thresholds(base, new))


def gate_power() -> str:
    """The smallest injected slowdown that every optimizer's row flags."""
    flagged = [title for name, title in GATE_RUNS[1:] if all(_gate(name).rows["regression"].astype(bool))]
    return f"{flagged[0].removesuffix(' injected')}" if flagged else "none of +15, +20 and +30 %"


def gate_rerun() -> str:
    result = _gate("rerun")
    return ("passes: no row flagged" if not result.regressions
            else f"FAILS: {len(result.regressions)} row(s) flagged")


def gate_table() -> str:
    """compare, at the calibrated CPU thresholds, of the base sweep with a same-commit rerun and with injected
    optimizer.step() slowdowns: the optimizer step's change, its 95 % interval, and whether it was flagged."""
    from optbench.report import compare

    columns: dict[str, dict[str, str]] = {}
    for name, title in GATE_RUNS:
        for row in _gate(name).rows.itertuples():
            change = f"{row.opt_step_ms_delta:+.1f} % ({row.opt_step_ms_low:+.1f} … {row.opt_step_ms_high:+.1f})"
            columns.setdefault(row.optimizer, {})[title] = change + (": **flagged**" if row.regression else ": pass")
    limit = compare.DEFAULT_THRESHOLDS["cpu"].max_slowdown_pct
    frame = pd.DataFrame.from_dict(columns, orient="index").rename_axis("optimizer").reset_index()
    return (frame.to_markdown(index=False) + f"\n\noptimizer-step change and its 95 % interval; the CPU limit is "
            f"+{limit:g} %: a change is flagged when its whole interval lies beyond it")


ALL = ("default.jsonl", "registry.jsonl", "smoke-all.jsonl", "resume-fsdp2.jsonl", "resume-trainer.jsonl",
       "study-smoke.jsonl", "study.jsonl", "study-control.jsonl", "saturated/study.jsonl",
       "saturated/study-100steps.jsonl",
       "schedule/constant.jsonl", "schedule/linear.jsonl", "lm.jsonl", "precision.jsonl", "engines/native.jsonl",
       "engines/trainer.jsonl", "engines/accelerate.jsonl", "parallel/ddp.jsonl", "parallel/zero1.jsonl",
       "parallel/fsdp2.jsonl", "gate/base.jsonl", "scaling.jsonl", "fidelity.jsonl")


def measured() -> tuple[str, ...]:
    """The files of ALL that are there now (a step whose design changed has none until it re-runs)."""
    return tuple(name for name in ALL if (RESULTS / name).is_file())


DELTA = "accuracy Δ vs adamw (95% CI)"
DETECTABLE = report.DETECTABLE
RESUME_COLUMNS = ("optimizer", "status", "state MiB", "ckpt MiB", "ckpt save s", "ckpt load s", "resume",
                  "resume max Δparam")
STUDY_COLUMNS = ("optimizer", "tuned lr", "near-tie band", "eval accuracy", "ceiling", DELTA, DETECTABLE,
                 "time to target s", "state MiB", "train mem MiB", "step ms")
TABLES: dict[str, Callable[[], str]] = {
    "study": lambda: render_table(Table(("study.jsonl",), STUDY_COLUMNS)),
    "study-control": lambda: render_table(Table(("study-control.jsonl",), (
        "optimizer", "tuned lr", "eval accuracy", "ceiling", DELTA, DETECTABLE, "step ms"))),
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
        "opt step ms", "impl", "roofline %", "bandwidth GB/s", "first step s", "eval accuracy"))),
    "smoke-all": lambda: render_table(Table(("smoke-all.jsonl",), (
        "optimizer", "state precision", "status", "state MiB", "state B/param", "= analytic", "fp32 state %",
        "first step s", "opt step ms", "ckpt MiB", "ckpt save s", "ckpt load s", "resume", "resume max Δparam"))),
    "resume-fsdp2": lambda: render_table(Table(("resume-fsdp2.jsonl",), RESUME_COLUMNS)),
    "resume-trainer": lambda: render_table(Table(("resume-trainer.jsonl",), RESUME_COLUMNS)),
    "lm": lambda: render_table(Table(("lm.jsonl",), (
        "optimizer", "state MiB", "state B/param", "fp32 state %", "eval perplexity", "floor",
        "perplexity Δ vs adamw (95% CI)", "step ms", "opt step ms", "roofline %"))),
    "precision": lambda: side_by_side("precision.jsonl"),
    "engines": lambda: side_by_side("engines/native.jsonl", "engines/trainer.jsonl", "engines/accelerate.jsonl"),
    "parallel": lambda: per_rank("parallel/ddp.jsonl", "parallel/zero1.jsonl", "parallel/fsdp2.jsonl"),
    "fit": fit_table,
    "fidelity": fidelity_table,
    "memory-split": memory_split,
    "scaling": scaling_tables,
    "gate": gate_table,
}
VALUES: dict[str, Callable[[], str]] = {
    "commit": lambda: commit(*measured()),
    "load": lambda: load_range(*measured()),
    "study.minutes": lambda: sweep_minutes("study.jsonl"),
    "study-control.minutes": lambda: sweep_minutes("study-control.jsonl"),
    "saturated-study.minutes": lambda: sweep_minutes("saturated/study.jsonl"),
    "study.ceiling": lambda: bound("study.jsonl", "metric_ceiling"),
    "default.vs-study": run_vs_study,
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
    "harness.ratio": lambda: harness("ratio"),
    "harness.pairs": lambda: harness("pairs"),
    "harness.spread": lambda: harness("spread"),
    "harness.verdict": lambda: harness("verdict"),
    "harness.summary": lambda: harness("summary"),
    "gate.mds": gate_power,
    "gate.rerun": gate_rerun,
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
