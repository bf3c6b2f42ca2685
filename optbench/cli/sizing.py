"""The commands that answer before any training (`list`, the registry, is cli/listing.py): `estimate` (weights +
grads + state), `recommend` (what fits a budget, best trade-offs first), `explain` (where an optimizer's state
bytes go) and `fit` (the largest batch each optimizer fits in a budget, predicted then confirmed). Each parses
nothing itself: it takes the parsed arguments, calls the module that knows, prints, and returns the exit status."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from optbench.cli.files import load_records
from optbench.cli.options import UsageError
from optbench.cli.sweeping import check_inputs, check_out
from optbench.job.spec import PARALLEL_NPROC
from optbench.records import exits


def _load(path: Path) -> list:
    """--results: a file with no records is refused, as `report` and `compare` refuse it, not read as "nothing
    measured" (which silently answers from nominal figures)."""
    records = load_records([path])
    if not records:
        raise UsageError(f"no records in {path}")
    return records


def _check_shape(args: argparse.Namespace, size) -> None:
    """--batch-size and --seq-len predict a peak from a model's config: both are needed, a --params count has no
    config (the flags were ignored), and a sequence past the model's learned positions cannot run at all."""
    given = [flag for flag, value in (("--batch-size", args.batch_size), ("--seq-len", args.seq_len)) if value]
    if not given:
        return
    if size.facts is None:
        raise UsageError(f"{' and '.join(given)} predict activations from a model's config: give --model "
                         "(a --params count has no config, so they would be ignored)")
    if size.facts.arch is None:
        raise UsageError(f"{' and '.join(given)}: the predictor knows no activation model for {size.facts.name}'s "
                         "architecture, so they would be ignored; drop them")
    if len(given) == 1:
        raise UsageError(f"{given[0]} needs {'--seq-len' if given[0] == '--batch-size' else '--batch-size'} too: "
                         "the predicted peak is for one batch of one sequence length")
    positions = size.facts.positions
    if positions is not None and args.seq_len > positions:
        raise UsageError(f"--seq-len {args.seq_len} is more than the {positions} positions {size.facts.name} has; "
                         f"use --seq-len {positions} or less")


def _size(args: argparse.Namespace):
    """The model `estimate` and `recommend` count: --params, or --model (with --num-labels' head) from its config;
    its --batch-size and --seq-len checked against it."""
    from optbench.memory import estimate

    if args.num_labels and args.params:
        raise UsageError("--num-labels needs --model (a --params count already includes any head)")
    try:
        size = (estimate.size_from_count(args.params) if args.params
                else estimate.size_from_model(args.model, args.num_labels))
    except estimate.EstimateError as exc:
        raise UsageError(str(exc)) from None
    _check_shape(args, size)
    return size


def _say(note: str | None) -> None:
    if note:
        print(f"optbench: note: {note}", file=sys.stderr)


def estimate_command(args: argparse.Namespace) -> int:
    from optbench.memory import estimate

    size = _size(args)
    measured = None
    if args.results:
        here, note = estimate.measured_here(_load(args.results), size, args.precision)
        _say(note)
        measured = estimate.measured_bytes_per_param(here)
    rows = estimate.estimate(size, measured, args.precision, args.batch_size, args.seq_len, args.device_kind)
    print(estimate.render(rows, size, args.gpus, args.gpu_memory, _entries(args.optimizers)))
    return exits.OK


def _entries(names: list[str] | None) -> set[str] | None:
    """--optimizers as registry names, by the rule every command's --optimizers follows (planner.resolve_names:
    aliases folded, `all`); None: every entry, this machine's or not (an estimate is for the machine the job will
    run on)."""
    from optbench.job import planner

    return None if names is None else set(planner.resolve_names(names))


def recommend_command(args: argparse.Namespace) -> int:
    """Exit 0 when something fits, 1 when nothing does (the answer says what to try)."""
    from optbench.memory import recommend

    size = _size(args)
    records = _load(args.results) if args.results else []
    rows = recommend.recommend(size, args.gpu_memory, records, args.precision, args.batch_size, args.seq_len,
                               args.device_kind, _entries(args.optimizers))
    _say(rows[0].memory_note if rows else None)
    print(recommend.render(rows, size, args.gpu_memory, args.precision, str(args.results) if args.results else None))
    return exits.OK if any(r.fits for r in rows) else exits.NOTHING_FITS


def explain_command(args: argparse.Namespace) -> int:
    """The state map; with --parallel, each rank's state and what sharding changes (or why that cannot be told)."""
    from optbench.memory import sharding, statemap

    if args.nproc is not None and args.parallel == "none":  # `--nproc 2` too: it was taken as the default, silently
        raise UsageError("--nproc needs a --parallel mode (ddp, zero1 or fsdp2)")
    try:
        print(statemap.explain(args.optimizer, workload=args.workload, model=args.model))
        if args.parallel != "none":
            nproc = args.nproc or PARALLEL_NPROC
            print("\n" + sharding.explain(args.optimizer, args.parallel, nproc, args.workload, args.model))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return exits.OK


def fit_command(args: argparse.Namespace) -> int:
    """Each optimizer at an equal memory budget: its largest batch (or sequence), confirmed by measurement."""
    import dataclasses
    import functools

    from optbench.job import planner
    from optbench.memory import fit
    from optbench.sweep import run_sweep

    names = planner.resolve_names(args.optimizers)
    given = {"workload": args.workload, "model": args.model, "batch_size": args.batch_size, "seq_len": args.seq_len,
             "device": args.device, "precision": args.precision}
    job = dataclasses.replace(fit.default_job(), **{k: v for k, v in given.items() if v is not None})
    if args.model and not args.workload:
        job = dataclasses.replace(job, workload="custom")
    try:
        fit.check_repeats(args.repeats)  # before --out's folder is made
    except fit.FitError as exc:
        raise UsageError(f"--repeats {args.repeats}: {exc}") from None
    check_inputs(job)  # a bad workload, model or device is one line here, not a traceback or six failed probes
    check_out(args.out)  # a folder or another tool's file there: one line now; it makes --out's folder, so last
    try:
        result = fit.fit(args.memory, names, args.out, job=job, grow_by=args.grow, max_size=args.max_size,
                         run=functools.partial(fit.run_probe, sweep=run_sweep), repeats=args.repeats)
    except fit.FitError as exc:
        raise UsageError(str(exc)) from None
    print(fit.render(result))
    print("wrote " + ", ".join(map(str, fit.save(result, args.out))))
    return exits.OK


COMMANDS = {"estimate": estimate_command, "recommend": recommend_command,
            "explain": explain_command, "fit": fit_command}
