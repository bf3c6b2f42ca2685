"""`optbench list`: the registry as a table that fits a 120-column terminal, why each unavailable entry cannot run
here (below the table, numbered), and where HF Trainer's `optim` names stand; `--format markdown|csv`: every
column, for a file or a spreadsheet."""

from __future__ import annotations

import argparse
import csv
import io
import textwrap
from typing import Any

from optbench.records import exits
from optbench.records.text import clip

WIDTH = 120
PRECISION_CHARS = 26  # the longest labels ("int8-blockwise, fp32 embeddings") are clipped in the terminal table


def _rows() -> list[dict[str, Any]]:
    """One dict per entry with everything the formats show, in registry order."""
    from optbench import optimizers

    rows = []
    for spec in optimizers.REGISTRY.values():
        low, high = spec.lr_range
        rows.append({
            "optimizer": spec.name, "hf_optim": spec.hf_alias, "other_names": ", ".join(spec.names[1:]),
            "precision": spec.precision, "state_bytes_per_param_1024x1024_fp32": round(spec.nominal_bytes_per_param, 3),
            "default_lr": f"{spec.default_lr:g}", "lr_range": f"{low:g} to {high:g}",  # not "1e-05-0.0003"
            "install": f"optbench[{spec.extra}]" if spec.extra else "core",
            "available_here": spec.unavailable_reason() is None, "why_not_here": spec.unavailable_reason() or "",
            "description": spec.description,
        })
    return rows


def render_text(rows: list[dict[str, Any]]) -> str:
    """The terminal table: the HF name shown as "=" where it is the entry's own name, the precision clipped, each
    unavailable entry pointing at a numbered reason below the table (entries sharing a reason share its number)."""
    from tabulate import tabulate

    reasons: dict[str, int] = {}
    table = []
    for row in rows:
        why = row["why_not_here"]
        here = "yes" if not why else f"no [{reasons.setdefault(why, len(reasons) + 1)}]"
        hf = "=" if row["hf_optim"] == row["optimizer"] else row["hf_optim"]
        table.append([row["optimizer"], hf, clip(row["precision"], PRECISION_CHARS),
                      f"{row['state_bytes_per_param_1024x1024_fp32']:.3f}", row["default_lr"],
                      row["install"].removeprefix("optbench"), here])
    text = tabulate(table, headers=["optimizer", "HF optim", "precision", "B/param", "lr", "install", "here"],
                    tablefmt="simple", disable_numparse=True)
    legend = ("HF optim: HF Trainer's `optim` name for the entry (=: the entry's own name). B/param: state bytes per "
              "parameter of a 1024x1024 fp32 matrix. install: core, or [extra] for `pip install \"optbench[extra]\"`.")
    lines = [*text.splitlines(), "", *textwrap.wrap(legend, width=WIDTH), "", "why not here:"]
    for why, number in reasons.items():
        lines += textwrap.wrap(f"[{number}] {why}", width=WIDTH, subsequent_indent="    ")
    return "\n".join(lines)


def hf_coverage() -> str:
    """Where transformers' `OptimizerNames` stand here: runnable, CUDA only, or another reason (named)."""
    import transformers
    from transformers.training_args import OptimizerNames

    from optbench import optimizers

    runnable, cuda, other = [], [], []
    for name in (member.value for member in OptimizerNames):
        spec = optimizers.resolve(name)
        (runnable if spec.available else cuda if spec.needs_cuda and not spec.broken else other).append(name)
    text = (f"HF Trainer optim names (transformers {transformers.__version__}): {len(runnable)} of "
            f"{len(runnable) + len(cuda) + len(other)} run here; {len(cuda)} need CUDA ({', '.join(cuda)}); "
            f"{len(other)} cannot for another reason ({', '.join(other)})")
    return "\n".join(textwrap.wrap(text, width=WIDTH))


def render_markdown(rows: list[dict[str, Any]]) -> str:
    from tabulate import tabulate

    return tabulate([list(row.values()) for row in rows], headers=list(rows[0]), tablefmt="github",
                    disable_numparse=True)


def render_csv(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def list_command(args: argparse.Namespace) -> int:
    from optbench import optimizers

    rows = _rows()
    if args.format == "csv":
        print(render_csv(rows), end="")
    elif args.format == "markdown":
        print(render_markdown(rows))
    else:
        print(render_text(rows))
        print("\n" + hf_coverage())
        print("\n" + optimizers.LIST_NOTES)
    return exits.OK


COMMANDS = {"list": list_command}
