"""`optbench report` (tables and figures from results files) and `optbench compare` (BASE vs NEW, exit 1 on a
regression)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from optbench.cli.files import check_output, load_records
from optbench.cli.options import UsageError
from optbench.records import exits

if TYPE_CHECKING:
    from optbench.report.compare import Thresholds


def report_command(args: argparse.Namespace) -> int:
    from optbench.report.render import write_report

    files = args.files or sorted(Path("results").glob("*.jsonl"))
    if not files:
        raise UsageError("no results files given and none in results/ (run `python -m optbench run` first)")
    records = load_records(files)
    if not records:
        raise UsageError(f"no records in {', '.join(map(str, files))}")
    out_dir = report_dir(files, args.out_dir)
    try:
        text, paths = write_report(records, out_dir, fmt=args.format, margin=args.margin)
    except OSError as exc:
        raise UsageError(f"cannot write the report into {out_dir}: {exc.strerror or exc}") from None
    print(text, end="" if text.endswith("\n") else "\n")
    print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    return exits.OK


def report_dir(files: list[Path], given: Path | None) -> Path:
    """Where the report goes: --out-dir; else one results file's own folder, the one `run --out FILE` writes its
    report to (a sweep's report must not land in, or overwrite, the working directory's results/); else results/."""
    if given is not None:
        return given
    if len(files) == 1 and files[0].is_file():
        return files[0].with_suffix("")
    return Path("results")


def with_overrides(limits: Thresholds, args: argparse.Namespace) -> Thresholds:
    """The calibrated thresholds with the ones given on the command line (compare's and nightly's flags)."""
    given = {"max_slowdown_pct": args.max_slowdown, "max_memory_growth_pct": args.max_memory_growth,
             "max_accuracy_drop_pts": args.max_accuracy_drop, "min_peak_growth_mib": args.min_peak_growth,
             "max_metric_worsening_pct": args.max_metric_worsening}
    return dataclasses.replace(limits, **{key: value for key, value in given.items() if value is not None})


def compare_command(args: argparse.Namespace) -> int:
    from optbench.report import compare, compare_table

    runs = {}
    for role, path in (("BASE", args.base), ("NEW", args.new)):
        runs[role] = load_records([path])
        if not runs[role]:
            raise UsageError(f"no records in {role} {path}")
    limits = with_overrides(compare.calibrated_thresholds(runs["BASE"], runs["NEW"]), args)
    history = load_records(args.noise_history) if args.noise_history else []
    if args.noise_history and not history:
        raise UsageError(f"no records in --noise-history {', '.join(map(str, args.noise_history))}")
    if args.export_github_benchmark is not None:  # before the comparison: a late exit 2 would hide a regression's 1
        read = (args.base, args.new, *(args.noise_history or ()))
        for path in (args.export_github_benchmark, compare_table.accuracy_export_path(args.export_github_benchmark)):
            check_output(path, "--export-github-benchmark", read)
    try:
        comparison = compare.compare(runs["BASE"], runs["NEW"], limits, history)
    except compare.CompareError as exc:
        raise UsageError(str(exc)) from None
    if args.strict_env and comparison.env_differences:
        raise UsageError("--strict-env: BASE and NEW ran in different environments: "
                         + "; ".join(comparison.env_differences))
    print(compare_table.render_markdown(comparison))
    if args.export_github_benchmark:
        try:
            paths = compare_table.export_github_benchmark(comparison, args.export_github_benchmark)
        except OSError as exc:
            raise UsageError(f"cannot write {args.export_github_benchmark}: {exc.strerror or exc}") from None
        print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    if not comparison.regressions:
        return exits.OK
    print("Regressions:\n" + "\n".join(f"- {line}" for line in comparison.regressions))
    print(f"optbench: {len(comparison.regressions)} regression(s) beyond the thresholds", file=sys.stderr)
    return exits.REGRESSION
